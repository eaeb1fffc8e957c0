"""What a sweep's end writes and `python -m runner.report` writes again: the summary per configuration and per job
(summary), the runs' metric histories (histories), the HTML report (report), both written together (outputs), and
the report command (report_command). May import runner.sweeps.study and the shared modules below it; not
.plugins, .job or .launch."""

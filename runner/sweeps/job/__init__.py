"""One job of a sweep: its child runs, each seed's and fold's training in a warm worker or a fresh process (job),
the command a run trained with (run_command), the folds' check (folds), and the champion's model logged at the
sweep's end (champion). May import runner.sweeps.launch, .study and the shared modules below them; not .plugins or
.report."""

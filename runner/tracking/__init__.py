"""Tracking: a job's MLflow run (params, metrics, checkpoints, status) and the child process that holds it.

The names of what a run holds (artifacts, run_id_file, ui, params, lifecycle's tags), null_tracker, the session
every transport shares (session), the tracker child's messages and runner.tracking.journal (what the tracker
process has not delivered yet, kept in the run directory) need no MLflow; the MLflow modules are imported only
where a run is tracked.
Never imports TensorFlow, except runner.tracking.model_export (a finished run's model, exported after its
last epoch); runner.tracking.registry holds the Model Registry's versions and the `champion` alias."""

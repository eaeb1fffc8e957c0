"""Tracking: a job's MLflow run (params, metrics, checkpoints, status) and the child process that holds it.

runner.tracking.common needs no MLflow; the MLflow modules are imported only where a run is tracked.
Never imports TensorFlow."""

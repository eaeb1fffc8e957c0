"""What a process of a concurrency test runs, in a module that imports no TensorFlow (spawned processes import
the module of the function they run)."""

from __future__ import annotations

import os

from helpers.config import mlflow_settings


def log_inputs_at_the_barrier(uri: str, run_dir: str, rounds, barrier, results) -> None:
    """As each job of a sweep does: a run, then its data logged at the same moment as the other processes',
    once per round (each round's datasets new to the store); puts the run id, or the error, on `results`."""
    from runner.tracking.mlflow_tracker import MlflowTracker

    tracker = MlflowTracker(mlflow_settings(uri, "mlflow.system_metrics.enabled=false"))
    os.makedirs(run_dir)
    run_id = tracker.start(run_dir, {"batch": 64})
    try:
        for descriptions in rounds:
            barrier.wait(timeout=120)
            tracker.log_inputs(descriptions)
    except Exception as error:
        barrier.abort()  # the others stop waiting for this one
        results.put(f"{type(error).__name__}: {error}")
        raise
    finally:
        tracker.finish()
    results.put(run_id)

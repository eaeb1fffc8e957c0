"""The one place a job's tracker is chosen and opened: the chief's MLflow run, through the tracker child process
(started before TensorFlow is imported, so MLflow loads on the other core) or in this process; nothing elsewhere."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from runner.config.schema import MlflowSettings
from runner.tracking.null_tracker import NullTracker
from runner.tracking.protocol import Tracker


@contextmanager
def opened_tracker(mlflow: MlflowSettings, *, tracks: bool, in_process: bool = False) -> Iterator[Tracker]:
    """The tracker of a process that `tracks` the job's run (a cluster's chief, or the one process), in a child
    process unless `in_process`, closed when the block ends; a NullTracker for a task that does not track."""
    if not tracks:
        yield NullTracker()
        return
    if in_process:
        from runner.tracking.mlflow_tracker import MlflowTracker  # noqa: PLC0415  MLflow: seconds, only where it tracks

        yield MlflowTracker(mlflow)
        return
    # Its import (multiprocessing, the tracker's messages) takes as long as psutil's: a command refused before
    # this point, the cluster=local launcher and a task that does not track never pay for it.
    from runner.tracking.tracker_process import TrackerProcess  # noqa: PLC0415  only a tracking process needs it

    process = TrackerProcess(mlflow)
    try:
        yield process
    finally:
        process.close()

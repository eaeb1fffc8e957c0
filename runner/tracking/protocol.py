"""What the training process calls on a tracker, as a type: the chief's TrackerProcess
(runner.tracking.tracker_process), an in-process MlflowTracker (runner.tracking.mlflow_tracker) and a worker's
NullTracker (runner.tracking.null_tracker) all have these methods, and the type checker holds each of them to it where
runner.train takes its tracker. No MLflow and no TensorFlow here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class EpochMetrics(Protocol):
    """The part of an epoch's result (runner.training.controller.EpochResult) that a tracker logs."""

    @property
    def epoch(self) -> int: ...

    def metrics(self) -> dict[str, float]: ...


class Tracker(Protocol):
    @property
    def tracking_uri(self) -> str | None:
        """The store the run is tracked in; None where nothing is tracked."""
        ...

    def start(self, run_dir: str, params: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> str | None:
        """Create (or continue) the run of run_dir and log its params: the run id; None where nothing is tracked."""
        ...

    def log_text(self, text: str, artifact_file: str) -> None: ...

    def log_inputs(self, descriptions: Sequence[Mapping[str, Any]]) -> None: ...

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...

    def metric_histories(self) -> dict[str, list[tuple[int, float]]]:
        """Every metric of the run as (step, value) pairs in step order, across resumed invocations."""
        ...

    # The controller's listener interface (runner.training.controller.Listener).
    def on_epoch_end(self, result: EpochMetrics) -> None: ...

    def on_checkpoint_saved(self, epoch: int, files: list[str]) -> None: ...

    def finish(self, error: BaseException | None = None, resumable: bool = False) -> None:
        """End the run: FINISHED without an error; KILLED and resumable after a preemption; FAILED otherwise."""
        ...

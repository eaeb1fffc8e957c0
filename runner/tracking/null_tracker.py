"""The tracker of a task that does not track: a worker beside the chief, which alone logs the job's one run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runner.tracking.protocol import EpochMetrics


class NullTracker:
    """The tracker of a worker that is not the chief: it trains in step with the chief, which alone
    logs, so a job has one MLflow run whatever its number of workers."""

    tracking_uri = None
    run_id = None

    def start(self, run_dir: str, params: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> None:
        return None

    def log_text(self, text: str, artifact_file: str) -> None: ...
    def log_inputs(self, descriptions: Sequence[Mapping[str, Any]]) -> None: ...
    def log_artifact(self, path: str, artifact_path: str | None = None) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...
    def set_tags(self, tags: Mapping[str, str]) -> None: ...
    def on_epoch_end(self, result: EpochMetrics) -> None: ...
    def on_checkpoint_saved(self, epoch: int, files: list[str]) -> None: ...
    def finish(self, error: BaseException | None = None, resumable: bool = False) -> None: ...

    def metric_histories(self) -> dict[str, list[tuple[int, float]]]:
        return {}

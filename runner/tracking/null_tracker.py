"""The tracker of a task that does not track: a worker beside the chief, which alone logs the job's one run."""

from __future__ import annotations


class NullTracker:
    """The tracker of a worker that is not the chief: it trains in step with the chief, which alone
    logs, so a job has one MLflow run whatever its number of workers."""

    tracking_uri = None
    run_id = None

    def start(self, *args, **kwargs) -> None:
        return None

    def log_text(self, *args, **kwargs) -> None: ...
    def log_inputs(self, *args, **kwargs) -> None: ...
    def log_artifact(self, *args, **kwargs) -> None: ...
    def log_metrics(self, *args, **kwargs) -> None: ...
    def on_epoch_end(self, result) -> None: ...
    def on_checkpoint_saved(self, epoch: int, files: list[str]) -> None: ...
    def finish(self, *args, **kwargs) -> None: ...

    def metric_histories(self) -> dict[str, list[tuple[int, float]]]:
        return {}

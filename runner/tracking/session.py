"""A run's session as the training process sees it, written once for either transport (the tracker child process,
runner.tracking.tracker_process, or MLflow in this process, runner.tracking.mlflow_tracker): what a call hands
over, the checkpoint-upload policy (mlflow.checkpoints), the run's end, and the check before a run is continued.
No MLflow here.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from runner.errors import RunnerError
from runner.tracking.artifacts import CHECKPOINTS_ARTIFACT_PATH, existing_files
from runner.tracking.lifecycle import failure_message
from runner.tracking.operations import End, LogArtifact, LogInputs, LogMetrics, LogText, Operation, SetTags
from runner.tracking.protocol import EpochMetrics

log = logging.getLogger("runner")

# Keys that change what the terminal shows, not what a run computes: a run resumes whatever they are now (a
# sweep job's `progress` depends on whether the sweep runs on a terminal).
PRESENTATION_KEYS = frozenset({"progress", "verbose"})


def millis() -> int:
    return int(time.time() * 1000)


def param_values(params: Mapping[str, Any]) -> dict[str, str]:
    """Params as MLflow stores them: strings, None as "None"."""
    return {key: "None" if value is None else str(value) for key, value in params.items()}


def continued_params(run_dir: str, run_id: str, logged: Mapping[str, str], values: Mapping[str, str]) -> dict[str, str]:
    """The params to log when run_dir's run `run_id` (which holds `logged`) is continued with `values`.

    A different configuration is refused before the run is touched, since MLflow params cannot change and the run's
    history must stay its own; the presentation keys keep the values the run was started with."""
    changed = {
        key: (old, values[key])
        for key, old in logged.items()
        if key in values and key not in PRESENTATION_KEYS and values[key] != old
    }
    if changed:
        listed = ", ".join(f"{key}={new} (the run has {old})" for key, (old, new) in sorted(changed.items()))
        raise RunnerError(
            f"{run_dir} belongs to MLflow run {run_id}, which was started with another configuration: "
            f"{listed}. Fix: re-run with that run's overrides to resume it, or pick a new "
            "hydra.run.dir (the default makes a new one per run) for this configuration."
        )
    return {**values, **{key: old for key, old in logged.items() if key in PRESENTATION_KEYS}}


class CheckpointUploads:
    """mlflow.checkpoints: `all` uploads each save as it is written; `last` remembers the newest checkpoint's files
    and uploads those still there when the run ends (only they are copied, once); `none` uploads nothing."""

    def __init__(self, policy: str, upload: Callable[[str, str], None]):
        self.policy = policy
        self._upload = upload
        self._newest: list[str] = []

    def saved(self, files: list[str]) -> None:
        if self.policy == "all":
            for path in files:
                self._upload(path, CHECKPOINTS_ARTIFACT_PATH)
        elif self.policy == "last":
            self._newest = list(files)

    def before_end(self, run_id: str | None) -> None:
        """Upload the newest checkpoint (policy `last`); a file that cannot be uploaded is reported and never keeps
        the run from ending."""
        files, self._newest = self._newest, []
        for path in existing_files(files):
            try:
                self._upload(path, CHECKPOINTS_ARTIFACT_PATH)
            except Exception as error:
                log.warning(
                    "could not log the checkpoint file %s to MLflow run %s (%s: %s); it stays in the run directory",
                    path,
                    run_id,
                    type(error).__name__,
                    " ".join(str(error).split())[:300],
                )


class TrackedRun:
    """The calls of runner.tracking.protocol.Tracker that hand something to the run, each as an Operation
    (runner.tracking.operations) that a transport sends: `send` delivers it, in this process or through the
    tracker child. Starting the run and reading its metrics are the transport's."""

    def __init__(self, checkpoints: str):
        self.checkpoints = CheckpointUploads(checkpoints, self.log_artifact)

    @property
    def run_id(self) -> str | None:
        """The run that is logged to, once the transport has started it."""
        raise NotImplementedError

    def send(self, operation: Operation) -> None:
        raise NotImplementedError

    def log_text(self, text: str, artifact_file: str) -> None:
        self.send(LogText(text=text, artifact_file=artifact_file))

    def log_inputs(self, descriptions: Sequence[Mapping[str, Any]]) -> None:
        self.send(LogInputs(descriptions=[dict(description) for description in descriptions]))

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        self.send(LogArtifact(path=os.path.abspath(path), artifact_path=artifact_path))

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.send(SetTags(tags={key: str(value) for key, value in tags.items()}))

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        floats = {key: float(value) for key, value in metrics.items()}
        self.send(LogMetrics(metrics=floats, step=int(step), timestamp=millis()))

    # The controller's listener interface (runner.training.controller.Listener).
    def on_epoch_end(self, result: EpochMetrics) -> None:
        self.log_metrics(result.metrics(), step=result.epoch)

    def on_checkpoint_saved(self, epoch: int, files: list[str]) -> None:
        self.checkpoints.saved(files)

    def finish(self, error: BaseException | None = None, resumable: bool = False) -> None:
        """FINISHED without an error; KILLED and tagged resumable after a preemption; FAILED otherwise. The newest
        checkpoint goes first (mlflow.checkpoints=last); the error is put in words here (its object, a TensorFlow
        error, may not cross to the tracker child)."""
        self.checkpoints.before_end(self.run_id)
        self.send(End(message=None if error is None else failure_message(error, resumable), resumable=resumable))

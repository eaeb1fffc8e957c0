"""What tracking a job is made of, without MLflow: the run-directory file and tag names, params from the
config, and the tracker of a task that does not track (the tracking server's check: runner.tracking.server_access).

The MLflow tracker itself is runner.tracking.mlflow_tracker; the training process reaches it through
runner.tracking.tracker_process, so that neither it nor this module makes the training process import MLflow.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.tracking.protocol import EpochMetrics

ERROR_TAG = "error"
RESUMABLE_TAG = "resumable"
RUN_ID_FILE = "mlflow_run_id.txt"
# A finished run's model: the LoggedModel of this name whose source run is the run (runs:/<run id>/model).
MODEL_NAME = "model"


# MLflow's own experiment tag that its UI reads to open an experiment as model training (the runs table), not
# in its GenAI mode ("Traces"), which MLflow 3's UI otherwise picks.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# Where a run's checkpoint files go among its MLflow artifacts (mlflow.checkpoints says which).
CHECKPOINTS_ARTIFACT_PATH = "checkpoints"
# mlflow ui's default address, for a store that no server serves.
UI_ADDRESS = "http://127.0.0.1:5000"


def ui_link(tracking_uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """Where to see the experiment's runs table (and the run `run_id`) in the MLflow UI, for the log: the
    server's own pages, or for a store without a server the `mlflow ui` command that serves it and the page
    at its default address. `?workflowType=machine_learning` opens the runs table, not MLflow 3's GenAI view."""
    if tracking_uri.startswith(("http://", "https://")):
        address, how = tracking_uri.rstrip("/"), ""
    else:
        address = UI_ADDRESS
        store = tracking_uri if tracking_uri.startswith("sqlite:") else "<the store of mlflow.tracking_uri>"
        how = f"`mlflow ui --backend-store-uri {store}`, then "
    table = f"{address}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
    run = f" (the run: {address}/#/experiments/{experiment_id}/runs/{run_id})" if run_id else ""
    return f"{how}{table}{run}"


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay values."""
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def write_run_id(run_dir: str, run_id: str) -> None:
    with open(os.path.join(run_dir, RUN_ID_FILE), "w") as handle:
        handle.write(run_id + "\n")


def failure_message(error: BaseException, resumable: bool = False) -> str:
    """The `error` tag of a run that ended with `error` (KILLED and resumable, or FAILED)."""
    if resumable:
        return f"{error} (resume: re-run the same command with the same hydra.run.dir)"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


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
    def on_epoch_end(self, result: EpochMetrics) -> None: ...
    def on_checkpoint_saved(self, epoch: int, files: list[str]) -> None: ...
    def finish(self, error: BaseException | None = None, resumable: bool = False) -> None: ...

    def metric_histories(self) -> dict[str, list[tuple[int, float]]]:
        return {}


def existing_files(paths: list[str]) -> list[str]:
    """The files of `paths` that are still there (a checkpoint may have been rotated away since it was saved)."""
    return [path for path in paths if os.path.isfile(path)]

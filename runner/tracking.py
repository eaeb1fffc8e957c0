"""MLflow tracking: one run per training job, with params, per-epoch metrics, checkpoints and curves.

Uses MlflowClient with an explicit run id (no fluent global state), so the tracker is a plain
listener on the controller's events and several trackers can live in one process.
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

from mlflow.entities import Metric, Param, RunStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

from runner.settings import MlflowSettings

ERROR_TAG = "error"
RUN_ID_FILE = "mlflow_run_id.txt"
_MAX_PARAMS_PER_BATCH = 100


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


def _millis() -> int:
    return int(time.time() * 1000)


def get_or_create_experiment(client: MlflowClient, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:  # another process created it between our two calls
        return client.get_experiment_by_name(name).experiment_id


class MlflowTracker:
    def __init__(self, settings: MlflowSettings):
        self.settings = settings
        self.client = MlflowClient(tracking_uri=settings.tracking_uri)
        self.run_id: str | None = None

    @property
    def tracking_uri(self) -> str:
        return self.client.tracking_uri

    def start(self, run_dir: str, tags: Mapping[str, str] | None = None) -> str:
        """Continue the run whose id run_dir/RUN_ID_FILE holds (a resumed job, or a sweep job whose
        run the sweep created), or create a new run and write its id there."""
        id_file = os.path.join(run_dir, RUN_ID_FILE)
        if os.path.exists(id_file):
            with open(id_file) as handle:
                self.run_id = handle.read().strip()
            self.client.update_run(self.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            for key, value in (tags or {}).items():
                self.client.set_tag(self.run_id, key, value)
            return self.run_id
        experiment_id = get_or_create_experiment(self.client, self.settings.experiment_name)
        run_tags = dict(tags or {})
        if self.settings.run_name:
            run_tags[MLFLOW_RUN_NAME] = self.settings.run_name
        run = self.client.create_run(experiment_id, tags=run_tags, run_name=self.settings.run_name)
        self.run_id = run.info.run_id
        write_run_id(run_dir, self.run_id)
        return self.run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        items = [Param(key, "None" if value is None else str(value)) for key, value in params.items()]
        for start in range(0, len(items), _MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[start: start + _MAX_PARAMS_PER_BATCH])

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, path, artifact_path)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        now = _millis()
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    # Controller listener interface
    def on_epoch_end(self, result) -> None:
        self.log_metrics(result.metrics(), step=result.epoch)

    def on_checkpoint_saved(self, epoch: int, files: list[str]) -> None:
        for path in files:
            self.log_artifact(path, "checkpoints")

    def finish(self, error: BaseException | None = None) -> None:
        if self.run_id is None:
            return
        if error is None:
            self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FINISHED))
            return
        message = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        self.client.set_tag(self.run_id, ERROR_TAG, message[:5000])
        self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FAILED))

"""The MLflow tracker: one run per training job, with params, per-epoch metrics, checkpoints and curves.

Uses MlflowClient with an explicit run id (no fluent global state), so the tracker is a plain
listener on the controller's events and several trackers can live in one process. The training
process drives it in a process of its own (runner.tracking.tracker_process).
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

from mlflow.entities import LoggedModel, Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

from runner.errors import RunnerError
from runner.settings import MlflowSettings
from runner.tracking.common import (
    ERROR_TAG, MODEL_NAME, RESUMABLE_TAG, RUN_ID_FILE, failure_message, write_run_id,
)
from runner.tracking.provenance import run_tags as provenance_tags

_MAX_PARAMS_PER_BATCH = 100


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


def run_model(client: MlflowClient, run_id: str) -> LoggedModel | None:
    """The run's model (runner.tracking.model_export logs it when the run finishes), or None."""
    experiment_id = client.get_run(run_id).info.experiment_id
    found = client.search_logged_models(
        [experiment_id], filter_string=f"name = '{MODEL_NAME}' AND source_run_id = '{run_id}'", max_results=1)
    return found[0] if found else None


class MlflowTracker:
    def __init__(self, settings: MlflowSettings):
        self.settings = settings
        self.client = MlflowClient(tracking_uri=settings.tracking_uri)
        self.run_id: str | None = None
        self._logged: set[tuple[str, int]] = set()

    @property
    def tracking_uri(self) -> str:
        return self.client.tracking_uri

    def start(self, run_dir: str, params: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> str:
        """Create a run for run_dir and log its params, or continue the run whose id run_dir/RUN_ID_FILE
        holds (a resumed job, or a sweep job whose run the sweep created).

        Continuing checks the params first: a different configuration is refused before the existing
        run is touched, since MLflow params cannot change and the run's history must stay its own.
        """
        values = {key: "None" if value is None else str(value) for key, value in params.items()}
        id_file = os.path.join(run_dir, RUN_ID_FILE)
        if os.path.exists(id_file):
            with open(id_file) as handle:
                run_id = handle.read().strip()
            run = self.client.get_run(run_id)
            changed = {key: (old, values[key]) for key, old in run.data.params.items()
                       if key in values and values[key] != old}
            if changed:
                listed = ", ".join(f"{key}={new} (the run has {old})" for key, (old, new) in sorted(changed.items()))
                raise RunnerError(
                    f"{run_dir} belongs to MLflow run {run_id}, which was started with another configuration: "
                    f"{listed}. Fix: re-run with that run's overrides to resume it, or pick a new "
                    "hydra.run.dir (the default makes a new one per run) for this configuration."
                )
            self.run_id = run_id
            self._logged = {(key, metric.step) for key in run.data.metrics
                            for metric in self.client.get_metric_history(run_id, key)}
            self.client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            self.client.set_tag(run_id, RESUMABLE_TAG, "false")
        else:
            experiment_id = get_or_create_experiment(self.client, self.settings.experiment_name)
            run_tags = {MLFLOW_RUN_NAME: self.settings.run_name} if self.settings.run_name else {}
            self.run_id = self.client.create_run(experiment_id, tags=run_tags, run_name=self.settings.run_name
                                                 ).info.run_id
            write_run_id(run_dir, self.run_id)
        # Where the code came from and what it ran on, set again on every resume: a run resumed with other
        # versions or on another machine shows the ones its last epochs were trained with.
        all_tags = {**provenance_tags(), **(tags or {})}
        self.client.log_batch(self.run_id, tags=[RunTag(key, str(value)) for key, value in all_tags.items()])
        self._log_params(values)
        return self.run_id

    def _log_params(self, values: Mapping[str, str]) -> None:
        items = [Param(key, value) for key, value in values.items()]
        for start in range(0, len(items), _MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[start: start + _MAX_PARAMS_PER_BATCH])

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, path, artifact_path)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Log each (metric, step) once: a resumed run re-trains an epoch it may have logged already."""
        now = _millis()
        fresh = [Metric(k, float(v), now, step) for k, v in metrics.items() if (k, step) not in self._logged]
        if fresh:
            self.client.log_batch(self.run_id, metrics=fresh)
            self._logged.update((metric.key, step) for metric in fresh)

    def metric_histories(self) -> dict[str, list[tuple[int, float]]]:
        """Every metric of the run as (step, value) pairs in step order, across resumed invocations."""
        run = self.client.get_run(self.run_id)
        return {key: sorted((m.step, m.value) for m in self.client.get_metric_history(self.run_id, key))
                for key in run.data.metrics}

    # Controller listener interface
    def on_epoch_end(self, result) -> None:
        self.log_metrics(result.metrics(), step=result.epoch)

    def on_checkpoint_saved(self, epoch: int, files: list[str]) -> None:
        for path in files:
            self.log_artifact(path, "checkpoints")

    def finish(self, error: BaseException | None = None, resumable: bool = False) -> None:
        """FINISHED without an error; KILLED and tagged resumable after a preemption; FAILED otherwise."""
        self.end(None if error is None else failure_message(error, resumable), resumable)

    def end(self, message: str | None, resumable: bool = False) -> None:
        """finish() with the error already put in words (see runner.tracking.common.failure_message)."""
        if self.run_id is None:
            return
        if message is None:
            self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FINISHED))
            return
        if resumable:
            self.client.set_tag(self.run_id, RESUMABLE_TAG, "true")
            self.client.set_tag(self.run_id, ERROR_TAG, message)
            self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.KILLED))
            return
        self.client.set_tag(self.run_id, ERROR_TAG, message[:5000])
        self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FAILED))

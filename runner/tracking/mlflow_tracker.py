"""The MLflow tracker: one run per training job, with params, per-epoch metrics, checkpoints and curves.

Which checkpoints the run's artifacts hold is mlflow.checkpoints: the newest one, logged when the run ends (last),
every save as it is written (all), or none.

Uses MlflowClient with an explicit run id (no fluent global state), so the tracker is a plain
listener on the controller's events and several trackers can live in one process. The training
process drives it in a process of its own (runner.tracking.tracker_process), which hands it the records of
the run's journal (runner.tracking.journal) through apply().
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import psutil
from mlflow.entities import Dataset, DatasetInput, InputTag, LoggedModel, Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

from runner.config.schema import MlflowSettings
from runner.errors import RunnerError
from runner.tracking import journal, operations
from runner.tracking.artifacts import CHECKPOINTS_ARTIFACT_PATH, MODEL_NAME, existing_files
from runner.tracking.lifecycle import ERROR_TAG, RESUMABLE_TAG, failure_message
from runner.tracking.operations import End, LogArtifact, LogInputs, LogMetrics, LogText, Operation, SystemMetrics
from runner.tracking.protocol import EpochMetrics
from runner.tracking.provenance import run_tags as provenance_tags
from runner.tracking.run_id_file import RUN_ID_FILE, write_run_id
from runner.tracking.store import open_client, sqlite_file
from runner.tracking.ui import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, ui_link

log = logging.getLogger("runner")

_MAX_PARAMS_PER_BATCH = 100
# Keys that change what the terminal shows, not what a run computes: a run resumes whatever they are now (a
# sweep job's `progress` depends on whether the sweep runs on a terminal).
PRESENTATION_KEYS = frozenset({"progress", "verbose"})
# MLflow's tag for the role a dataset played in a run ("training", "evaluation").
DATASET_CONTEXT_TAG = "mlflow.data.context"


_DATASET_INSERT_ATTEMPTS = 5


def _lost_an_insert_race(error: MlflowException) -> bool:
    """Whether an MLflow store refused an insert for a unique key another process had just taken (sqlite's
    and PostgreSQL's wording, also when a tracking server passes it on)."""
    text = str(error)
    return "UNIQUE constraint failed" in text or "duplicate key value violates unique constraint" in text


@contextlib.contextmanager
def _names_apart_from_the_seed() -> Iterator[None]:
    """MLflow names an unnamed run from Python's global `random`, which a training process has seeded with
    its `seed` by then: every run with the same seed would get the same name. Draw it from fresh entropy, and
    leave the seeded sequence as it was."""
    state = random.getstate()
    random.seed()
    try:
        yield
    finally:
        random.setstate(state)


def _millis() -> int:
    return int(time.time() * 1000)


def get_or_create_experiment(client: MlflowClient, name: str) -> str:
    """The experiment's id; one the runner creates is tagged as model training, so that MLflow's UI opens it on
    its runs table (an existing experiment keeps its own tags)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    except MlflowException:  # another process created it between our two calls
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def run_model(client: MlflowClient, run_id: str) -> LoggedModel | None:
    """The run's model (runner.tracking.model_export logs it when the run finishes), or None."""
    experiment_id = client.get_run(run_id).info.experiment_id
    found = client.search_logged_models(
        [experiment_id], filter_string=f"name = '{MODEL_NAME}' AND source_run_id = '{run_id}'", max_results=1
    )
    return found[0] if found else None


class MlflowTracker:
    def __init__(self, settings: MlflowSettings):
        self.settings = settings
        self.client = open_client(settings.tracking_uri)
        self.run_id: str | None = None
        self._logged: set[tuple[str, int]] = set()
        self._system_metrics = None
        # Where the system-metrics monitor hands its samples, (metrics, step, timestamp) -> None; None: logged
        # to the run directly. The tracker process journals them like every other record.
        self.system_metrics_sink: Callable[[dict[str, float], int, int], None] | None = None
        # Every metric of the run as start() found it: {key: [(step, value), ...]} (empty for a new run).
        self.history_at_start: dict[str, list[tuple[int, float]]] = {}
        # mlflow.checkpoints=last: the newest checkpoint's files, logged when the run ends (end()).
        self.last_checkpoint: list[str] = []

    @property
    def tracking_uri(self) -> str:
        return self.client.tracking_uri

    @property
    def _run_id(self) -> str:
        """The run that is logged to: start() or attach() gave it."""
        if self.run_id is None:
            raise RuntimeError("the MLflow tracker has no run yet: start() or attach() one first")
        return self.run_id

    def start(self, run_dir: str, params: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> str:
        """Create a run for run_dir and log its params, or continue the run whose id run_dir/RUN_ID_FILE
        holds (a resumed job, or a sweep job whose run the sweep created).

        Continuing checks the params first: a different configuration is refused before the existing
        run is touched, since MLflow params cannot change and the run's history must stay its own. Then
        whatever an earlier invocation left undelivered in run_dir's journal is delivered, before anything new.
        """
        values = {key: "None" if value is None else str(value) for key, value in params.items()}
        id_file = os.path.join(run_dir, RUN_ID_FILE)
        if os.path.exists(id_file):
            with open(id_file) as handle:
                run_id = handle.read().strip()
            run = self.client.get_run(run_id)
            changed = {
                key: (old, values[key])
                for key, old in run.data.params.items()
                if key in values and key not in PRESENTATION_KEYS and values[key] != old
            }
            if changed:
                listed = ", ".join(f"{key}={new} (the run has {old})" for key, (old, new) in sorted(changed.items()))
                raise RunnerError(
                    f"{run_dir} belongs to MLflow run {run_id}, which was started with another configuration: "
                    f"{listed}. Fix: re-run with that run's overrides to resume it, or pick a new "
                    "hydra.run.dir (the default makes a new one per run) for this configuration."
                )
            # MLflow params cannot change: the run keeps the presentation keys it was started with.
            values.update({key: old for key, old in run.data.params.items() if key in PRESENTATION_KEYS})
            self.attach(run_id)
            replayed = journal.replay(run_dir, self.apply)
            if replayed:
                log.info(
                    "delivered %d record(s) that an earlier invocation left in %s to MLflow run %s",
                    replayed,
                    os.path.join(run_dir, journal.JOURNAL_FILE),
                    run_id,
                )
                self.attach(run_id)
            self.client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            self.client.set_tag(run_id, RESUMABLE_TAG, "false")
        else:
            experiment_id = get_or_create_experiment(self.client, self.settings.experiment_name)
            run_tags = {MLFLOW_RUN_NAME: self.settings.run_name} if self.settings.run_name else {}
            with _names_apart_from_the_seed():
                run_id = self.client.create_run(
                    experiment_id, tags=run_tags, run_name=self.settings.run_name
                ).info.run_id
            self.run_id = run_id
            write_run_id(run_dir, run_id)
        # Where the code came from and what it ran on, set again on every resume: a run resumed with other
        # versions or on another machine shows the ones its last epochs were trained with.
        all_tags = {**provenance_tags(), **(tags or {})}
        self.client.log_batch(run_id, tags=[RunTag(key, str(value)) for key, value in all_tags.items()])
        self._log_params(values)
        self._start_system_metrics()
        experiment_id = self.client.get_run(run_id).info.experiment_id
        database = sqlite_file(self.tracking_uri)
        store = f"sqlite:///{database}" if database else self.tracking_uri
        log.info("MLflow UI: %s", ui_link(store, experiment_id, run_id))
        return run_id

    def attach(self, run_id: str) -> None:
        """Track into the existing run `run_id`, knowing which (metric, step) it holds already."""
        self.run_id = run_id
        self.history_at_start = self.metric_histories()
        self._logged = {(key, step) for key, points in self.history_at_start.items() for step, _ in points}

    def _start_system_metrics(self) -> None:
        """MLflow's own monitor, attached by run id (it attaches itself only to fluent runs); its thread
        samples CPU, memory, disk, network and GPUs every interval and logs them under system/."""
        settings = self.settings.system_metrics
        if not settings.enabled or self._system_metrics is not None:
            return
        # Its start and stop announcements at INFO would interleave with the run's own log on the terminal.
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
        monitor = _system_metrics_monitor(
            self._publish_system_metrics,
            self._run_id,
            sampling_interval=settings.interval_seconds,
            samples_before_logging=1,
            resume_logging=True,
            tracking_uri=self.client.tracking_uri,
        )
        monitor.monitors = [
            _FirstSampleMeasuredCpu() if type(each) is CPUMonitor else each for each in monitor.monitors
        ]
        # The config decides, not MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL left in the environment.
        monitor.sampling_interval = settings.interval_seconds
        monitor.start()
        self._system_metrics = monitor

    def _publish_system_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.system_metrics_sink is not None:
            self.system_metrics_sink(metrics, step, _millis())
        else:
            self._log_system_metrics(metrics, step, _millis())

    def _log_system_metrics(self, metrics: Mapping[str, float], step: int, timestamp: int) -> None:
        self.client.log_batch(
            self._run_id, metrics=[Metric(key, float(value), timestamp, step) for key, value in metrics.items()]
        )

    def stop_system_metrics(self) -> None:
        """Log what the monitor holds while the run is still RUNNING, then stop its thread."""
        monitor, self._system_metrics = self._system_metrics, None
        if monitor is not None:
            monitor.finish()

    def log_inputs(self, descriptions: Sequence[Mapping[str, Any]]) -> None:
        """The run's data as MLflow dataset inputs (see runner.training.data.describe), each once: a resumed
        run, or a sweep job run again, finds them already there.

        Runs that start together (a sweep's jobs) log the same dataset at once: MLflow's store looks the
        dataset up, then inserts it, and all but one such insert break its unique key, which rolls back that
        call whole. The losers try again, and then find the dataset there."""
        for attempt in range(1, _DATASET_INSERT_ATTEMPTS + 1):
            try:
                return self._log_fresh_inputs(descriptions)
            except MlflowException as error:
                if attempt == _DATASET_INSERT_ATTEMPTS or not _lost_an_insert_race(error):
                    raise
                time.sleep(0.1 * attempt)

    def _log_fresh_inputs(self, descriptions: Sequence[Mapping[str, Any]]) -> None:
        run = self.client.get_run(self._run_id)
        logged = {
            (
                item.dataset.name,
                item.dataset.digest,
                next((tag.value for tag in item.tags if tag.key == DATASET_CONTEXT_TAG), None),
            )
            for item in (run.inputs.dataset_inputs if run.inputs else [])
        }
        fresh = [
            DatasetInput(_dataset_entity(description), tags=[InputTag(DATASET_CONTEXT_TAG, description["context"])])
            for description in descriptions
            if (description["name"], description["digest"], description["context"]) not in logged
        ]
        if fresh:
            self.client.log_inputs(self._run_id, datasets=fresh)

    def _log_params(self, values: Mapping[str, str]) -> None:
        items = [Param(key, value) for key, value in values.items()]
        for start in range(0, len(items), _MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self._run_id, params=items[start : start + _MAX_PARAMS_PER_BATCH])

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self._run_id, text, artifact_file)

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self._run_id, path, artifact_path)

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp: int | None = None) -> None:
        """Log each (metric, step) once: a resumed run re-trains an epoch it may have logged already.
        `timestamp` (milliseconds): when it was measured, if not now (a journaled record delivered later)."""
        now = _millis() if timestamp is None else timestamp
        fresh = [Metric(k, float(v), now, step) for k, v in metrics.items() if (k, step) not in self._logged]
        if fresh:
            self.client.log_batch(self._run_id, metrics=fresh)
            self._logged.update((metric.key, step) for metric in fresh)

    def metric_histories(self) -> dict[str, list[tuple[int, float]]]:
        """Every metric of the run as (step, value) pairs in step order, across resumed invocations."""
        run_id = self._run_id
        run = self.client.get_run(run_id)
        return {
            key: sorted((m.step, m.value) for m in self.client.get_metric_history(run_id, key))
            for key in run.data.metrics
        }

    def apply(self, op: str, args: Mapping[str, Any]) -> None:
        """Deliver one record of the run's journal (runner.tracking.journal)."""
        self.deliver(operations.from_journal(op, args))

    def deliver(self, operation: Operation) -> None:
        """Log one operation of the run (the tracker process hands them over, runner.tracking.operations)."""
        match operation:
            case LogMetrics():
                self.log_metrics(operation.metrics, operation.step, operation.timestamp)
            case SystemMetrics():
                self._log_system_metrics(operation.metrics, operation.step, operation.timestamp)
            case LogText():
                self.log_text(operation.text, operation.artifact_file)
            case LogArtifact():
                self.log_artifact(operation.path, operation.artifact_path)
            case LogInputs():
                self.log_inputs(operation.descriptions)
            case End():
                self.end(operation.message, operation.resumable)
            case _:
                operations.unhandled(operation)

    # Controller listener interface
    def on_epoch_end(self, result: EpochMetrics) -> None:
        self.log_metrics(result.metrics(), step=result.epoch)

    def on_checkpoint_saved(self, epoch: int, files: list[str]) -> None:
        """mlflow.checkpoints: all logs each save now; last remembers the newest for end(); none logs nothing."""
        if self.settings.checkpoints == "all":
            for path in files:
                self.log_artifact(path, CHECKPOINTS_ARTIFACT_PATH)
        elif self.settings.checkpoints == "last":
            self.last_checkpoint = list(files)

    def finish(self, error: BaseException | None = None, resumable: bool = False) -> None:
        """FINISHED without an error; KILLED and tagged resumable after a preemption; FAILED otherwise."""
        self.end(None if error is None else failure_message(error, resumable), resumable)

    def end(self, message: str | None, resumable: bool = False) -> None:
        """finish() with the error already put in words (see runner.tracking.lifecycle.failure_message)."""
        if self.run_id is None:
            return
        self.stop_system_metrics()
        self._log_last_checkpoint()
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

    def _log_last_checkpoint(self) -> None:
        """mlflow.checkpoints=last: the newest checkpoint's files (those still there), before the run's status is
        set; a file that cannot be logged is reported and never keeps the run from ending."""
        files, self.last_checkpoint = self.last_checkpoint, []
        for path in existing_files(files):
            try:
                self.log_artifact(path, CHECKPOINTS_ARTIFACT_PATH)
            except Exception as error:
                log.warning(
                    "could not log the checkpoint file %s to MLflow run %s (%s: %s); it stays in the run directory",
                    path,
                    self.run_id,
                    type(error).__name__,
                    " ".join(str(error).split())[:300],
                )


def _dataset_entity(description: Mapping[str, Any]) -> Dataset:
    """An MLflow dataset entity from a description, as mlflow.data.from_numpy would make it from the arrays
    (same schema and profile fields), without the arrays."""
    import numpy as np
    from mlflow.data.schema import TensorDatasetSchema
    from mlflow.types import Schema, TensorSpec

    features, targets = description["features"], description["targets"]

    def spec(part: Mapping[str, Any]) -> Schema:
        return Schema([TensorSpec(np.dtype(part["dtype"]), (-1, *part["shape"][1:]))])

    profile = {
        "features_shape": features["shape"],
        "features_size": int(np.prod(features["shape"])),
        "features_nbytes": features["nbytes"],
        "targets_shape": targets["shape"],
        "targets_size": int(np.prod(targets["shape"])),
        "targets_nbytes": targets["nbytes"],
    }
    return Dataset(
        name=description["name"],
        digest=description["digest"],
        source_type=description["source_type"],
        source=json.dumps(description["source"]),
        schema=json.dumps(TensorDatasetSchema(spec(features), spec(targets)).to_dict()),
        profile=json.dumps(profile),
    )


def _system_metrics_monitor(publish: Callable[[dict[str, float], int], None], *args, **kwargs):
    """MLflow's SystemMetricsMonitor, with two changes: each sample goes to `publish(metrics, step)` (the
    tracker decides how it reaches the run), and the sampling thread does not ask the server for the run's
    status before every sample (a server that stops answering would stop MLflow's loop for good, with a
    warning on the terminal); it stops when the tracker stops it."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    class Monitor(SystemMetricsMonitor):
        def monitor(self) -> None:
            while True:
                for _ in range(self.samples_before_logging):
                    self.collect_metrics()
                    if self._shutdown_event.wait(self.sampling_interval):
                        return
                self.publish_metrics(self.aggregate_metrics())

        def publish_metrics(self, metrics) -> None:
            prefix = self._metrics_prefix + (self.node_id + "/" if self.node_id else "")
            try:
                publish({prefix + key: value for key, value in metrics.items()}, self._logging_step)
            except Exception as error:  # as MLflow's own loop does: the run goes on without them
                log.warning("system metrics are no longer logged: %s", error)
                self._shutdown_event.set()
            self._logging_step += 1
            for each in self.monitors:
                each.clear_metrics()

    return Monitor(*args, **kwargs)


class _FirstSampleMeasuredCpu(CPUMonitor):
    """MLflow's CPU monitor, whose first sample measures a short window instead of reading 0: psutil measures
    since the calling thread's previous call, and the sampling thread is new."""

    WINDOW_SECONDS = 0.2
    _started = False

    def collect_metrics(self):
        if not self._started:
            psutil.cpu_percent()
            time.sleep(self.WINDOW_SECONDS)  # on the sampling thread: nothing waits for it
            self._started = True
        super().collect_metrics()

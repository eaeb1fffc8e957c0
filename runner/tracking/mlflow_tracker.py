"""The MLflow tracker: one run per training job, with params, per-epoch metrics, checkpoints and curves, MLflow in
this process.

start() creates the run, or continues the one the run directory names (a resumed job, or a sweep job whose run
the sweep created); what is handed to the run goes through a RunWriter (runner.tracking.run_writer), the
checkpoint-upload policy and the run's end through the session every transport shares (runner.tracking.session).
The training process drives one in a process of its own (runner.tracking.tracker_process, its child in
runner.tracking.tracker_child), which delivers the records of the run's journal (runner.tracking.journal) through
deliver().
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from mlflow.entities import LoggedModel, RunTag
from mlflow.exceptions import MlflowException
from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

from runner.compat.mlflow_internals import system_metrics_monitor
from runner.config.schema import MlflowSettings
from runner.tracking import operations
from runner.tracking.artifacts import MODEL_NAME
from runner.tracking.operations import End, Operation
from runner.tracking.provenance import run_tags as provenance_tags
from runner.tracking.run_id_file import read_run_id, write_run_id
from runner.tracking.run_writer import RunWriter
from runner.tracking.session import TrackedRun, continued_params, millis, param_values
from runner.tracking.store import open_client, sqlite_file
from runner.tracking.ui import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, ui_link

log = logging.getLogger("runner")


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


def run_model(client: MlflowClient, run_id: str, name: str = MODEL_NAME) -> LoggedModel | None:
    """The run's model (runner.tracking.model_export logs it when the run finishes), or another of its
    LoggedModels by name (a checkpoint's, `checkpoint-<epoch>`), or None."""
    experiment_id = client.get_run(run_id).info.experiment_id
    found = client.search_logged_models(
        [experiment_id], filter_string=f"name = '{name}' AND source_run_id = '{run_id}'", max_results=1
    )
    return found[0] if found else None


class MlflowTracker(TrackedRun):
    def __init__(self, settings: MlflowSettings):
        super().__init__(settings.checkpoints)
        self.settings = settings
        self.writer = RunWriter(open_client(settings.tracking_uri))
        self._system_metrics: SystemMetricsMonitor | None = None
        # Where the system-metrics monitor hands its samples, (metrics, step, timestamp) -> None; None: logged
        # to the run directly. The tracker process journals them like every other record.
        self.system_metrics_sink: Callable[[dict[str, float], int, int], None] | None = None

    @property
    def client(self) -> MlflowClient:
        return self.writer.client

    @property
    def run_id(self) -> str | None:
        """The writer's: set by start() or attach()."""
        return self.writer.run_id

    @property
    def tracking_uri(self) -> str:
        return self.client.tracking_uri

    @property
    def history_at_start(self) -> dict[str, list[tuple[int, float]]]:
        """Every metric of the run as start() found it: {key: [(step, value), ...]} (empty for a new run)."""
        return self.writer.history_at_start

    def start(self, run_dir: str, params: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> str:
        """Create a run for run_dir and log its params, or continue the run whose id run_dir's run id file holds
        (checked first, then what an earlier invocation left undelivered in run_dir's journal goes before
        anything new)."""
        values = param_values(params)
        earlier = read_run_id(run_dir)
        if earlier is None:
            run_id = self._create_run(run_dir)
        else:
            values = self._continue_run(run_dir, earlier, values)
            run_id = earlier
        self._tag_provenance(run_id, tags)
        self.writer.log_params(values)
        self._start_system_metrics(run_id)
        self._log_ui_link(run_id)
        return run_id

    def _create_run(self, run_dir: str) -> str:
        experiment_id = get_or_create_experiment(self.client, self.settings.experiment_name)
        run_tags = {MLFLOW_RUN_NAME: self.settings.run_name} if self.settings.run_name else {}
        with _names_apart_from_the_seed():
            run_id = self.client.create_run(experiment_id, tags=run_tags, run_name=self.settings.run_name).info.run_id
        self.writer.created(run_id)
        write_run_id(run_dir, run_id)
        return run_id

    def _continue_run(self, run_dir: str, run_id: str, values: dict[str, str]) -> dict[str, str]:
        """The params to log: refused before the run is touched if they differ from the run's."""
        values = continued_params(run_dir, run_id, self.client.get_run(run_id).data.params, values)
        self.writer.attach(run_id)
        self.writer.deliver_journal(run_dir)
        self.writer.running()
        return values

    def _tag_provenance(self, run_id: str, tags: Mapping[str, str] | None) -> None:
        """Where the code came from and what it ran on, set again on every resume: a run resumed with other
        versions or on another machine shows the ones its last epochs were trained with."""
        all_tags = {**provenance_tags(), **(tags or {})}
        self.client.log_batch(run_id, tags=[RunTag(key, str(value)) for key, value in all_tags.items()])

    def _log_ui_link(self, run_id: str) -> None:
        experiment_id = self.client.get_run(run_id).info.experiment_id
        database = sqlite_file(self.tracking_uri)
        store = f"sqlite:///{database}" if database else self.tracking_uri
        log.info("MLflow UI: %s", ui_link(store, experiment_id, run_id))

    def attach(self, run_id: str) -> None:
        """Track into the existing run `run_id`, knowing which (metric, step) it holds already."""
        self.writer.attach(run_id)

    def _start_system_metrics(self, run_id: str) -> None:
        """MLflow's own monitor, attached by run id (it attaches itself only to fluent runs); its thread
        samples CPU, memory, disk, network and GPUs every interval and logs them under system/."""
        settings = self.settings.system_metrics
        if not settings.enabled or self._system_metrics is not None:
            return
        # Its start and stop announcements at INFO would interleave with the run's own log on the terminal.
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
        monitor = system_metrics_monitor(
            self._publish_system_metrics,
            run_id,
            interval_seconds=settings.interval_seconds,
            tracking_uri=self.tracking_uri,
        )
        monitor.start()
        self._system_metrics = monitor

    def _publish_system_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.system_metrics_sink is not None:
            self.system_metrics_sink(metrics, step, millis())
        else:
            self.writer.log_system_metrics(metrics, step, millis())

    def stop_system_metrics(self) -> None:
        """Log what the monitor holds while the run is still RUNNING, then stop its thread."""
        monitor, self._system_metrics = self._system_metrics, None
        if monitor is not None:
            monitor.finish()

    def metric_histories(self) -> dict[str, list[tuple[int, float]]]:
        """Every metric of the run as (step, value) pairs in step order, across resumed invocations."""
        return self.writer.metric_histories()

    def send(self, operation: Operation) -> None:
        """Deliver `operation` now; the monitor's last sample goes in before the run ends."""
        if isinstance(operation, End):
            self.stop_system_metrics()
        self.writer.deliver(operation)

    def apply(self, op: str, args: Mapping[str, Any]) -> None:
        """Deliver one record of the run's journal (runner.tracking.journal)."""
        self.send(operations.from_journal(op, args))

    def deliver(self, operation: Operation) -> None:
        """Log one operation of the run (the tracker child hands them over, runner.tracking.operations)."""
        self.send(operation)

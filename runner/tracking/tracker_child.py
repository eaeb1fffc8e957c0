"""The tracker child's side (runner.tracking.tracker_process starts it): it answers calls one at a time, journals
each record as it comes (runner.tracking.journal) and delivers them on a thread of its own
(runner.tracking.delivery) through an MlflowTracker.

It creates nothing until the first call (a job that fails during set-up leaves no tracking store behind), ignores
SIGINT and SIGTERM (the training process decides how the run ends), passes its log lines to the training process's
log, and returns when the training process closes it or dies (then at once: the journal keeps what it had not
delivered). Importing this module imports no MLflow: the training process names serve() as the child's target.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from runner.config.settings import MlflowSettings
from runner.errors import RunnerError
from runner.tracking import journal
from runner.tracking.operations import End, LogArtifact, LogMetrics, Operation, SystemMetrics, journal_args
from runner.tracking.tracker_messages import (
    Call,
    Close,
    LogLine,
    MetricHistories,
    Reply,
    Request,
    Start,
    ToChild,
    ToParent,
    TrackingUri,
)

if TYPE_CHECKING:
    from runner.tracking.delivery import Delivery
    from runner.tracking.mlflow_tracker import MlflowTracker

log = logging.getLogger("runner")

# MLflow's HTTP client in the child: no retries of its own (it would retry for minutes with back-off; the
# delivery tries again from the journal instead), and a request unanswered for this many seconds has failed.
REQUEST_TIMEOUT_SECONDS = "30"
# start() tries this often, pausing a second more each time, when the store does not answer.
START_TRIES = 4


@dataclass(frozen=True)
class Ahead:
    """A run's MLflow settings and its process's working directory (where a relative sqlite:/// store lies)."""

    settings: MlflowSettings
    cwd: str


def serve(connection: Connection, settings: MlflowSettings | None, ahead: Ahead | None = None) -> None:
    """The child process: answers calls one at a time, journals records as they come, delivers them on a thread.
    Started ahead of its run (`settings` None: runner.tracking.tracker_process.start_spare), it imports MLflow and
    opens the store `ahead` names (the last run's, where it exists), then waits for its own run's settings and
    working directory (or returns once its pipe closes); the store opened ahead serves if they are the same."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", REQUEST_TIMEOUT_SECONDS)
    if settings is not None:
        Child(connection, settings).serve()
        return
    opened = _opened_ahead(ahead)
    try:
        wanted: Ahead = connection.recv()
    except (EOFError, OSError):  # never needed: its process is ending
        return
    os.chdir(wanted.cwd)
    Child(connection, wanted.settings, opened if wanted == ahead else None).serve()


def _opened_ahead(ahead: Ahead | None) -> MlflowTracker | None:
    """MLflow imported and, for `ahead`, its existing store opened (nothing is created ahead of a run)."""
    from runner.tracking.mlflow_tracker import MlflowTracker  # noqa: PLC0415  MLflow: the import a spare takes ahead

    if ahead is None:
        return None
    os.chdir(ahead.cwd)
    if not _store_exists(ahead.settings):
        return None
    tracker = MlflowTracker(ahead.settings)
    tracker.client.get_experiment_by_name(ahead.settings.experiment_name)  # open the store now
    return tracker


class Child:
    def __init__(self, connection: Connection, settings: MlflowSettings, opened: MlflowTracker | None = None):
        self.connection, self.settings = connection, settings
        self._send_lock = threading.Lock()
        handler = _ToTrainingProcess(self.send)
        runner_log = logging.getLogger("runner")
        runner_log.addHandler(handler)
        runner_log.setLevel(logging.INFO)
        runner_log.propagate = False
        # The import this process exists to take off the training process's path:
        from runner.tracking.mlflow_tracker import MlflowTracker  # noqa: PLC0415  MLflow: in the child only

        self.tracker_class = MlflowTracker
        self.tracker: MlflowTracker | None = opened
        if self.tracker is None and _store_exists(settings):
            self.tracker = MlflowTracker(settings)
            self.tracker.client.get_experiment_by_name(settings.experiment_name)  # open the store now
        self.journal: journal.Journal | None = None
        self.delivery: Delivery | None = None
        self.journal_ready = threading.Event()
        # What the run's metrics will be once delivered: {key: {step: value}}, for metric_histories in an outage.
        self.mirror: dict[str, dict[int, float]] = {}

    def send(self, message: ToParent) -> None:
        with self._send_lock:
            try:
                self.connection.send(message)
            except (OSError, ValueError):  # the training process is gone
                pass

    def serve(self) -> None:
        while True:
            try:
                message: ToChild = self.connection.recv()
            except (EOFError, OSError):  # the training process died: stop; the journal keeps the rest
                return
            if isinstance(message, Call):
                self.call(message)
            elif isinstance(message, Close):
                return self.close()
            else:
                self.record(message)

    def call(self, call: Call) -> None:
        try:
            reply = Reply(call.number, True, self.answer(call.request))
        except Exception as error:  # it is the caller's error: raised there
            reply = Reply(call.number, False, _picklable(error))
        self.send(reply)

    def answer(self, request: Request[Any]) -> Any:
        match request:
            case Start():
                return self.start(request.run_dir, request.params, request.tags)
            case MetricHistories():
                return self.metric_histories()
            case TrackingUri():
                return self.opened().tracking_uri
        raise ValueError(f"unknown request {request!r}")

    def opened(self) -> MlflowTracker:
        """The MLflow tracker, created (with its store) by the first call that needs it."""
        if self.tracker is None:
            self.tracker = self.tracker_class(self.settings)
        return self.tracker

    def start(self, run_dir: str, params: dict[str, Any], tags: dict[str, str] | None) -> str:
        from runner.tracking.delivery import Delivery, reason, unanswered  # noqa: PLC0415  MLflow: in the child only

        tracker = self.opened()
        if self.delivery is not None and self.journal is not None:
            # Started again (tests do): what the first start logged goes first.
            self.delivery.wait(self.journal.last_seq, self.connection.poll)
            self.delivery.stop()
            self.journal.close()
            self.journal = self.delivery = None
            self.journal_ready.clear()
        tracker.system_metrics_sink = self.journal_system_metrics
        for attempt in range(1, START_TRIES + 1):
            try:
                run_id = tracker.start(run_dir, params, tags)
                break
            except Exception as error:
                if not unanswered(error):
                    raise
                if attempt == START_TRIES:
                    raise RunnerError(
                        f"the MLflow tracking store {tracker.tracking_uri} did not answer while the run started "
                        f"({reason(error)}). Fix: check that the tracking server is up (docs/team-server.md), then "
                        "re-run the same command; nothing was trained."
                    ) from None
                time.sleep(attempt)
        self.mirror = {key: dict(points) for key, points in tracker.history_at_start.items()}
        self.journal = journal.Journal(run_dir, run_id, _absolute(tracker.tracking_uri))
        self.delivery = Delivery(self.journal, tracker.apply, tracker.tracking_uri, self.settings.outage_seconds)
        self.delivery.start()
        self.journal_ready.set()
        return run_id

    def journal_system_metrics(self, metrics: dict[str, float], step: int, timestamp: int) -> None:
        """The system-metrics monitor's samples (on its thread), journaled like every other record."""
        if self.journal_ready.wait(timeout=60) and self.journal is not None:
            operation = SystemMetrics(metrics=metrics, step=step, timestamp=timestamp)
            self.journal.append(operation.op, journal_args(operation))

    def record(self, operation: Operation) -> None:
        tracker = self.tracker
        if self.journal is None or tracker is None:  # nothing is logged before start; should it be, it is delivered
            try:  # at once (a record opens no store: only a call does)
                if tracker is None:
                    raise RunnerError("no call has opened the tracking store yet")
                tracker.deliver(operation)
            except Exception as error:
                log.warning("could not log %s to MLflow before the run started: %s", operation.op, error)
            return
        if isinstance(operation, LogMetrics):
            for key, value in operation.metrics.items():
                self.mirror.setdefault(key, {}).setdefault(operation.step, value)
        if isinstance(operation, End):  # the monitor's last sample goes in before the run ends
            tracker.stop_system_metrics()
        try:
            self.journal.append(operation.op, journal_args(operation))
        except OSError as error:
            log.warning(
                "could not keep %s for MLflow run %s (%s); it is not logged. Fix: check the run directory's disk.",
                operation.path if isinstance(operation, LogArtifact) else operation.op,
                tracker.run_id,
                error,
            )

    def metric_histories(self) -> dict[str, list[tuple[int, float]]]:
        tracker = self.opened()
        if self.journal is None or self.delivery is None:
            return tracker.metric_histories()
        from runner.tracking.delivery import unanswered  # noqa: PLC0415  MLflow: in the child only

        # The training process waits for this answer: anything to read meanwhile means it is gone.
        if self.delivery.wait(self.journal.last_seq, self.connection.poll):
            try:
                return tracker.metric_histories()
            except Exception as error:
                if not unanswered(error):
                    raise
        # The store is down: the histories it will hold once the journal is delivered.
        return {key: sorted(points.items()) for key, points in self.mirror.items()}

    def close(self) -> None:
        """Deliver what is left (waiting out an outage up to mlflow.outage_seconds), then end."""
        if self.journal is None or self.delivery is None:
            return
        # After "close" the training process sends nothing more: anything to read means it is gone.
        delivered = self.delivery.wait(self.journal.last_seq, self.connection.poll)
        self.delivery.stop()
        self.journal.close()
        if delivered:
            journal.remove(self.journal.run_dir)


class _ToTrainingProcess(logging.Handler):
    """The child's `runner` log lines, passed to the training process's log (its terminal and runner.log)."""

    def __init__(self, send: Callable[[ToParent], None]):
        super().__init__(logging.INFO)
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._send(LogLine(record.levelno, record.getMessage()))
        except Exception:
            self.handleError(record)


def _absolute(tracking_uri: str) -> str:
    """A sqlite URI with its file's absolute path, so the journal's replay finds the store from anywhere."""
    from runner.tracking.store import sqlite_file  # noqa: PLC0415  MLflow: the training process imports this module

    database = sqlite_file(tracking_uri)
    return f"sqlite:///{database}" if database else tracking_uri


def _store_exists(settings: MlflowSettings) -> bool:
    """True when opening the store creates nothing: a sqlite file that is already there."""
    from mlflow import get_tracking_uri  # noqa: PLC0415  MLflow: in the child only

    from runner.tracking.store import sqlite_file  # noqa: PLC0415  MLflow: the training process imports this module

    database = sqlite_file(settings.tracking_uri or get_tracking_uri())
    return database is not None and os.path.isfile(database)


def _picklable(error: Exception) -> Exception:
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")

"""The chief's MLflow tracker in a process of its own, which training never waits for.

Importing MLflow and opening its sqlite store take seconds, which in the training process would all be
spent before the first training step. A TrackerProcess is started before TensorFlow is imported: its
child imports MLflow and opens an existing store on the other core while the training process imports
TensorFlow, and no MLflow call holds the training process's GIL while it trains (only the model's export,
after the last epoch, imports MLflow there: runner.tracking.model_export). It has MlflowTracker's methods.

Metrics, texts, artifacts, dataset inputs and the run's end are handed over without waiting: the training
process puts them on a bounded queue that a thread sends to the child, which journals each one in the run
directory (runner.tracking.journal) and delivers them in order on a thread of its own (runner.tracking.delivery).
A tracking server that stops answering therefore neither stops nor slows training; what was logged meanwhile
reaches the run once it answers again. Only the calls whose answer the training process needs wait: start
(the run id; its errors are raised here) and metric_histories (after the last epoch: it waits until everything
logged before has been delivered, or the server has been down for mlflow.outage_seconds). close() waits the
same way; whatever is still undelivered then stays in the journal, which the next invocation in the run
directory delivers first (or `python -m runner.tracking.replay <run dir>`), and the log says so.

The child creates nothing until the first call (a job that fails during set-up leaves no tracking store
behind), ignores SIGINT and SIGTERM (the training process decides how the run ends: after a SIGTERM it
is KILLED and resumable), passes its log lines to the training process's log, and exits when the training
process closes it or dies (then at once: the journal keeps what it had not delivered).
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from runner.config.schema import MlflowSettings
from runner.errors import RunnerError
from runner.tracking import journal
from runner.tracking.artifacts import CHECKPOINTS_ARTIFACT_PATH, existing_files
from runner.tracking.lifecycle import failure_message
from runner.tracking.operations import (
    End,
    LogArtifact,
    LogInputs,
    LogMetrics,
    LogText,
    Operation,
    SystemMetrics,
    journal_args,
)
from runner.tracking.protocol import EpochMetrics

if TYPE_CHECKING:
    from runner.tracking.delivery import Delivery
    from runner.tracking.mlflow_tracker import MlflowTracker

log = logging.getLogger("runner")

# close() gives the child this long beyond mlflow.outage_seconds to end by itself before it is killed.
CLOSE_SECONDS = 30.0
# Messages the training process may have waiting to be sent to the child before a call waits for room. The
# child reads them as they come (it only journals them), so the queue stays near empty.
QUEUE_SIZE = 10_000
# MLflow's HTTP client in the child: no retries of its own (it would retry for minutes with back-off; the
# delivery tries again from the journal instead), and a request unanswered for this many seconds has failed.
REQUEST_TIMEOUT_SECONDS = "30"
# start() tries this often, pausing a second more each time, when the store does not answer.
START_TRIES = 4

Answer = TypeVar("Answer")


# What crosses the pipe. The training process sends the child a call it waits for (_Call, answered by a _Reply
# with the same number), an Operation it does not wait for, or _Close; the child sends replies and its log lines.
class _Request(Generic[Answer]):
    """A call whose answer the training process waits for: the child answers it with answer(child)."""

    def answer(self, child: _Child) -> Answer:
        raise NotImplementedError


@dataclass(frozen=True)
class _Start(_Request[str]):
    run_dir: str
    params: dict[str, Any]
    tags: dict[str, str] | None

    def answer(self, child: _Child) -> str:
        return child.start(self.run_dir, self.params, self.tags)


@dataclass(frozen=True)
class _MetricHistories(_Request[dict[str, list[tuple[int, float]]]]):
    def answer(self, child: _Child) -> dict[str, list[tuple[int, float]]]:
        return child.metric_histories()


@dataclass(frozen=True)
class _TrackingUri(_Request[str]):
    def answer(self, child: _Child) -> str:
        return child.opened().tracking_uri


@dataclass(frozen=True)
class _Call:
    number: int
    request: _Request[Any]


@dataclass(frozen=True)
class _Close:
    pass


@dataclass(frozen=True)
class _Reply:
    number: int
    ok: bool
    value: Any  # the answer, or (not ok) the exception to raise


@dataclass(frozen=True)
class _LogLine:
    level: int
    message: str


_ToChild = _Call | Operation | _Close
_ToParent = _Reply | _LogLine


class TrackerProcess:
    def __init__(self, settings: MlflowSettings):
        # spawn, not fork: safe whatever this process already runs (TensorFlow's threads, in tests).
        context = multiprocessing.get_context("spawn")
        self._connection, child_end = context.Pipe()
        self._process = context.Process(target=_serve, args=(child_end, settings), name="runner-mlflow-tracker")
        self._process.start()
        child_end.close()
        self._settings = settings
        # Only these two threads touch the pipe: a signal handler that raises in the main thread (SIGTERM's
        # Preempted, Ctrl-C) never leaves a message half-sent or a reply half-read.
        self._outbox: queue.Queue[_ToChild | None] = queue.Queue(maxsize=QUEUE_SIZE)
        self._lock = threading.Lock()
        self._waiting: dict[int, Future[tuple[bool, Any]]] = {}
        self._ids = itertools.count(1)
        self._lost: RunnerError | None = None
        self._closing = False
        self._sender = threading.Thread(target=self._send_all, name="runner-tracker-send", daemon=True)
        self._receiver = threading.Thread(target=self._receive_all, name="runner-tracker-receive", daemon=True)
        self._sender.start()
        self._receiver.start()
        self.run_id: str | None = None
        self.tracking_uri: str | None = None
        self._run_dir: str | None = None
        self._last_checkpoint: list[str] = []  # mlflow.checkpoints=last: the newest checkpoint's files

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def _send_all(self) -> None:
        while True:
            message = self._outbox.get()
            if message is None:
                return
            try:
                self._connection.send(message)
            except (OSError, ValueError):  # the child is gone: the receiving thread says so
                return

    def _receive_all(self) -> None:
        while True:
            try:
                message: _ToParent = self._connection.recv()
            except (EOFError, OSError):
                break
            if isinstance(message, _Reply):
                with self._lock:
                    future = self._waiting.pop(message.number, None)
                if future is not None:
                    future.set_result((message.ok, message.value))
            else:
                log.log(message.level, message.message)
        with self._lock:
            if not self._closing:
                self._process.join(timeout=1)
                self._lost = RunnerError(
                    f"the MLflow tracker process (pid {self._process.pid}) ended unexpectedly (exit code "
                    f"{self._process.exitcode}). Fix: see its error above, then re-run the same command with the same "
                    "hydra.run.dir to resume from the last checkpoint (what it had been handed is delivered then)."
                )
            error = self._lost or RunnerError("the MLflow tracker process was closed")
            for future in self._waiting.values():
                future.set_result((False, error))
            self._waiting.clear()

    def _call(self, request: _Request[Answer]) -> Answer:
        """Have the child answer `request` and wait for the answer (or its error, raised here)."""
        future: Future[tuple[bool, Any]] = Future()
        with self._lock:
            if self._lost is not None:
                raise self._lost
            number = next(self._ids)
            self._waiting[number] = future
        self._outbox.put(_Call(number, request))
        ok, value = future.result()
        if not ok:
            raise value
        return value

    def _record(self, operation: Operation) -> None:
        """Hand an operation to the child without waiting for anything."""
        if self._lost is not None:
            raise self._lost
        self._outbox.put(operation)

    # The tracker's interface (runner.tracking.protocol.Tracker), as MlflowTracker has it
    def start(self, run_dir: str, params: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> str:
        run_id = self._call(_Start(run_dir, dict(params), dict(tags) if tags else None))
        self.run_id = run_id
        self._run_dir = run_dir
        self.tracking_uri = self._call(_TrackingUri())
        return run_id

    def log_text(self, text: str, artifact_file: str) -> None:
        self._record(LogText(text=text, artifact_file=artifact_file))

    def log_inputs(self, descriptions: Sequence[Mapping[str, Any]]) -> None:
        self._record(LogInputs(descriptions=[dict(description) for description in descriptions]))

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        self._record(LogArtifact(path=os.path.abspath(path), artifact_path=artifact_path))

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._record(
            LogMetrics(
                metrics={key: float(value) for key, value in metrics.items()},
                step=int(step),
                timestamp=int(time.time() * 1000),
            )
        )

    def metric_histories(self) -> dict[str, list[tuple[int, float]]]:
        return self._call(_MetricHistories())

    def on_epoch_end(self, result: EpochMetrics) -> None:
        self.log_metrics(result.metrics(), step=result.epoch)

    def on_checkpoint_saved(self, epoch: int, files: list[str]) -> None:
        """As MlflowTracker.on_checkpoint_saved; `last` is remembered here, so that only the newest checkpoint's
        files are journaled (copied), when the run ends."""
        if self._settings.checkpoints == "all":
            for path in files:
                self.log_artifact(path, CHECKPOINTS_ARTIFACT_PATH)
        elif self._settings.checkpoints == "last":
            self._last_checkpoint = list(files)

    def finish(self, error: BaseException | None = None, resumable: bool = False) -> None:
        # mlflow.checkpoints=last: the newest checkpoint's files (those still there) go before the run's end.
        files, self._last_checkpoint = self._last_checkpoint, []
        for path in existing_files(files):
            self.log_artifact(path, CHECKPOINTS_ARTIFACT_PATH)
        # The error is put in words here: its object (a TensorFlow error) may not cross the pipe.
        self._record(End(message=None if error is None else failure_message(error, resumable), resumable=resumable))

    def close(self) -> None:
        """Let the child deliver what it holds (within mlflow.outage_seconds of an outage) and end; kill it if it
        does not end in time or on Ctrl-C. Whatever it could not deliver stays in the run directory's journal,
        and the log says how to deliver it."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._outbox.put(_Close())
        self._outbox.put(None)
        deadline = time.monotonic() + self._settings.outage_seconds + CLOSE_SECONDS
        try:
            while self._process.is_alive() and time.monotonic() < deadline:
                self._process.join(timeout=0.5)
        except KeyboardInterrupt:  # stop waiting for the server: the journal keeps the rest
            pass
        if self._process.is_alive():
            log.warning("the MLflow tracker process (pid %d) did not end; killing it", self._process.pid)
            self._process.kill()
            self._process.join()
        self._sender.join(timeout=5)
        self._receiver.join(timeout=5)
        self._connection.close()
        if self._run_dir is not None:
            warn_if_undelivered(self._run_dir, self.run_id, self.tracking_uri)


def warn_if_undelivered(run_dir: str, run_id: str | None, tracking_uri: str | None) -> None:
    """The one paragraph for a process that ends with records its tracking server has not taken."""
    _, records = journal.pending(run_dir)
    if not records:
        return
    ended = any(record.op == "end" for record in records)
    log.warning(
        "%d record(s) of MLflow run %s (%s) did not reach the tracking store %s, which was not answering: they are "
        "kept in %s. Nothing is lost: once the store answers, deliver them with `python -m runner.tracking.replay "
        "%s`, or re-run the same command with hydra.run.dir=%s, which delivers them before anything else%s.",
        len(records),
        run_id,
        ", ".join(sorted({_kind(record.op) for record in records})),
        tracking_uri,
        os.path.join(run_dir, journal.JOURNAL_FILE),
        run_dir,
        run_dir,
        "" if ended else " (the run shows RUNNING until then)",
    )


def _kind(op: str) -> str:
    return {
        "log_metrics": "metrics",
        "system_metrics": "system metrics",
        "log_text": "artifacts",
        "log_artifact": "artifacts",
        "log_inputs": "dataset inputs",
        "end": "its end status",
    }.get(op, op)


def _serve(connection: Connection, settings: MlflowSettings) -> None:
    """The child: answers calls one at a time, journals records as they come, delivers them on a thread."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", REQUEST_TIMEOUT_SECONDS)
    _Child(connection, settings).serve()


class _Child:
    def __init__(self, connection: Connection, settings: MlflowSettings):
        self.connection, self.settings = connection, settings
        self._send_lock = threading.Lock()
        handler = _ToTrainingProcess(self.send)
        runner_log = logging.getLogger("runner")
        runner_log.addHandler(handler)
        runner_log.setLevel(logging.INFO)
        runner_log.propagate = False
        # The import this process exists to take off the training process's path:
        from runner.tracking.mlflow_tracker import MlflowTracker

        self.tracker_class = MlflowTracker
        self.tracker: MlflowTracker | None = MlflowTracker(settings) if _store_exists(settings) else None
        if self.tracker is not None:
            self.tracker.client.get_experiment_by_name(settings.experiment_name)  # open the store now
        self.journal: journal.Journal | None = None
        self.delivery: Delivery | None = None
        self.journal_ready = threading.Event()
        # What the run's metrics will be once delivered: {key: {step: value}}, for metric_histories in an outage.
        self.mirror: dict[str, dict[int, float]] = {}

    def send(self, message: _ToParent) -> None:
        with self._send_lock:
            try:
                self.connection.send(message)
            except (OSError, ValueError):  # the training process is gone
                pass

    def serve(self) -> None:
        while True:
            try:
                message: _ToChild = self.connection.recv()
            except (EOFError, OSError):  # the training process died: stop; the journal keeps the rest
                return
            if isinstance(message, _Call):
                self.call(message)
            elif isinstance(message, _Close):
                return self.close()
            else:
                self.record(message)

    def call(self, call: _Call) -> None:
        try:
            reply = _Reply(call.number, True, call.request.answer(self))
        except Exception as error:  # it is the caller's error: raised there
            reply = _Reply(call.number, False, _picklable(error))
        self.send(reply)

    def opened(self) -> MlflowTracker:
        """The MLflow tracker, created (with its store) by the first call that needs it."""
        if self.tracker is None:
            self.tracker = self.tracker_class(self.settings)
        return self.tracker

    def start(self, run_dir: str, params: dict[str, Any], tags: dict[str, str] | None) -> str:
        from runner.tracking.delivery import Delivery, reason, unanswered

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
        from runner.tracking.delivery import unanswered

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

    def __init__(self, send: Callable[[_ToParent], None]):
        super().__init__(logging.INFO)
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._send(_LogLine(record.levelno, record.getMessage()))
        except Exception:
            self.handleError(record)


def _absolute(tracking_uri: str) -> str:
    """A sqlite URI with its file's absolute path, so the journal's replay finds the store from anywhere."""
    from runner.tracking.store import sqlite_file

    database = sqlite_file(tracking_uri)
    return f"sqlite:///{database}" if database else tracking_uri


def _store_exists(settings: MlflowSettings) -> bool:
    """True when opening the store creates nothing: a sqlite file that is already there."""
    from mlflow import get_tracking_uri

    from runner.tracking.store import sqlite_file

    database = sqlite_file(settings.tracking_uri or get_tracking_uri())
    return database is not None and os.path.isfile(database)


def _picklable(error: Exception) -> Exception:
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")

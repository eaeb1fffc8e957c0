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

This module is the training process's side (the proxy); the messages are runner.tracking.tracker_messages and the
child's loop runner.tracking.tracker_child. What a call hands over, the checkpoint-upload policy and the run's end
are the session every transport shares (runner.tracking.session).
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from runner.config.schema import MlflowSettings
from runner.errors import RunnerError
from runner.tracking import journal
from runner.tracking.operations import Operation
from runner.tracking.session import TrackedRun
from runner.tracking.tracker_child import Ahead, serve
from runner.tracking.tracker_messages import (
    Answer,
    Call,
    Close,
    MetricHistories,
    Reply,
    Request,
    Start,
    ToChild,
    ToParent,
    TrackingUri,
)

log = logging.getLogger("runner")

# close() gives the child this long beyond mlflow.outage_seconds to end by itself before it is killed.
CLOSE_SECONDS = 30.0
# Messages the training process may have waiting to be sent to the child before a call waits for room. The
# child reads them as they come (it only journals them), so the queue stays near empty.
QUEUE_SIZE = 10_000


def _spawn(settings: MlflowSettings | None, ahead: Ahead | None = None) -> tuple[BaseProcess, Connection]:
    """A tracker child and this process's end of its pipe; `settings` None: it imports MLflow (and opens the store of
    `ahead`, the last run's) and waits for its run's settings and working directory."""
    # spawn, not fork: safe whatever this process already runs (TensorFlow's threads, in tests).
    context = multiprocessing.get_context("spawn")
    connection, child_end = context.Pipe()
    process = context.Process(target=serve, args=(child_end, settings, ahead), name="runner-mlflow-tracker")
    process.start()
    child_end.close()
    return process, connection


# A tracker child started ahead of the next run (start_spare): at most one per process.
_spare: list[tuple[BaseProcess, Connection]] = []
# The settings and working directory of the last run tracked from this process: the store a spare opens ahead.
_last: list[Ahead] = []


def start_spare() -> None:
    """Start a tracker child for the next run now (a warm sweep worker between two trials), so that it has imported
    MLflow, and opened the last run's store, by the time that run starts: the next TrackerProcess hands it its
    settings instead of starting one."""
    if not _spare:
        _spare.append(_spawn(None, _last[-1] if _last else None))


def discard_spare() -> None:
    """End the spare tracker child, if any (its pipe closed, it returns): before this process exits."""
    while _spare:
        process, connection = _spare.pop()
        connection.close()
        process.join(timeout=CLOSE_SECONDS)
        if process.is_alive():
            process.kill()
            process.join()


def _take_spare(settings: MlflowSettings) -> tuple[BaseProcess, Connection] | None:
    """The spare child, handed `settings` and this process's working directory, if one is alive."""
    while _spare:
        process, connection = _spare.pop()
        try:
            if process.is_alive():
                connection.send(Ahead(settings, os.getcwd()))
                return process, connection
        except (OSError, ValueError):
            pass
        connection.close()
        process.join(timeout=1)
    return None


class TrackerProcess(TrackedRun):
    def __init__(self, settings: MlflowSettings):
        super().__init__(settings.checkpoints)
        self._process, self._connection = _take_spare(settings) or _spawn(settings)
        _last[:] = [Ahead(settings, os.getcwd())]
        self._settings = settings
        # Only these two threads touch the pipe: a signal handler that raises in the main thread (SIGTERM's
        # Preempted, Ctrl-C) never leaves a message half-sent or a reply half-read.
        self._outbox: queue.Queue[ToChild | None] = queue.Queue(maxsize=QUEUE_SIZE)
        self._lock = threading.Lock()
        self._waiting: dict[int, Future[tuple[bool, Any]]] = {}
        self._ids = itertools.count(1)
        self._lost: RunnerError | None = None
        self._closing = False
        self._sender = threading.Thread(target=self._send_all, name="runner-tracker-send", daemon=True)
        self._receiver = threading.Thread(target=self._receive_all, name="runner-tracker-receive", daemon=True)
        self._sender.start()
        self._receiver.start()
        self._run_id: str | None = None
        self.tracking_uri: str | None = None
        self._run_dir: str | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def run_id(self) -> str | None:
        return self._run_id

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
                message: ToParent = self._connection.recv()
            except (EOFError, OSError):
                break
            if isinstance(message, Reply):
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

    def _call(self, request: Request[Answer]) -> Answer:
        """Have the child answer `request` and wait for the answer (or its error, raised here)."""
        future: Future[tuple[bool, Any]] = Future()
        with self._lock:
            if self._lost is not None:
                raise self._lost
            number = next(self._ids)
            self._waiting[number] = future
        self._outbox.put(Call(number, request))
        ok, value = future.result()
        if not ok:
            raise value
        return value

    def send(self, operation: Operation) -> None:
        """Hand an operation to the child without waiting for anything."""
        if self._lost is not None:
            raise self._lost
        self._outbox.put(operation)

    # The calls whose answer the training process waits for (runner.tracking.protocol.Tracker)
    def start(self, run_dir: str, params: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> str:
        run_id = self._call(Start(run_dir, dict(params), dict(tags) if tags else None))
        self._run_id = run_id
        self._run_dir = run_dir
        self.tracking_uri = self._call(TrackingUri())
        return run_id

    def metric_histories(self) -> dict[str, list[tuple[int, float]]]:
        return self._call(MetricHistories())

    def close(self) -> None:
        """Let the child deliver what it holds (within mlflow.outage_seconds of an outage) and end; kill it if it
        does not end in time or on Ctrl-C. Whatever it could not deliver stays in the run directory's journal,
        and the log says how to deliver it."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._outbox.put(Close())
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

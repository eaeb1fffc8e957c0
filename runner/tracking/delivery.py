"""Delivering the run's journal (runner.tracking.journal) to MLflow, in the tracker process: in order, one record
at a time, on a thread of its own, riding out a tracking store that stops answering.

A record the store does not answer for (no connection, a timeout, a 5xx or 429 from the server or a proxy in
front of it) is tried again every few seconds until the store takes it, for as long as it takes: the training
process never waits for any of it, and the run's log says once that the store stopped answering and once that it
answers again. A record the store refuses (a 4xx: the record's own fault) is tried a few times, then left out
with a warning. Only a process that ends waits for the delivery (Delivery.wait), and no longer than
`mlflow.outage_seconds` after the store stopped answering.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import requests
from mlflow.exceptions import MlflowException
from sqlalchemy.exc import OperationalError

from runner.tracking.journal import Journal, Record

log = logging.getLogger("runner")

REFUSALS = 3  # tries of a record the store answers with an error before it is left out
PAUSE_SECONDS = (1.0, 5.0)  # the first and the longest pause between two tries while the store does not answer


def unanswered(error: BaseException) -> bool:
    """Whether `error` says the tracking store did not answer (try again later), not that it refused."""
    if isinstance(error, MlflowException):  # MLflow's client wraps connection errors as INTERNAL_ERROR (500)
        status = error.get_http_status_code()
        return status >= 500 or status == 429
    if isinstance(error, requests.exceptions.HTTPError) and error.response is not None:
        return error.response.status_code >= 500 or error.response.status_code == 429
    if isinstance(
        error, (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError, TimeoutError)
    ):
        return True
    return isinstance(error, OperationalError)


def reason(error: BaseException) -> str:
    """The gist of a connection error ("[Errno 111] Connection refused") rather than MLflow's whole URL chain."""
    text = str(error)
    found = re.search(r"\[Errno -?\d+\] [^'\")\]]+", text)
    if found:
        return found.group(0).strip()
    found = re.search(r"Caused by (\w+)\('([^']*)'", text)  # urllib3's chain: ProtocolError('Connection aborted.', ...)
    if found:
        return f"{found.group(1)}: {found.group(2)}"
    found = re.search(r"Read timed out[^'\")]*", text)
    if found:
        return found.group(0).strip()
    return text if len(text) <= 200 else text[:200] + "..."


def describe(record: Record) -> str:
    args = record.args
    if record.op == "log_metrics":
        return f"the metrics of step {args['step']} ({', '.join(sorted(args['metrics']))})"
    if record.op == "system_metrics":
        return f"the system metrics of step {args['step']}"
    if record.op == "log_text":
        return f"the text artifact {args['artifact_file']}"
    if record.op == "log_artifact":
        return f"the artifact {'/'.join(filter(None, (args.get('artifact_path'), args['path'].split('/')[-1])))}"
    if record.op == "log_inputs":
        return "the dataset inputs"
    if record.op == "end":
        return "the run's end status"
    return f"the record {record.op}"


class Delivery:
    """The thread that hands the journal's records to `apply` (MlflowTracker.apply) in order."""

    def __init__(
        self, journal: Journal, apply: Callable[[str, dict[str, Any]], None], store: str, outage_seconds: float
    ):
        self.journal, self.apply, self.store, self.outage_seconds = journal, apply, store, outage_seconds
        self.outage_since: float | None = None  # time.monotonic() when the store stopped answering
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runner-mlflow-delivery", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Deliver nothing more (a record being delivered finishes or fails; either way it stays journaled)."""
        self._stopped.set()

    def _run(self) -> None:
        while True:
            record = self.journal.next(self._stopped)
            if record is None or not self._deliver(record):
                return
            self.journal.delivered(record)

    def _deliver(self, record: Record) -> bool:
        """True once the store took the record (or refused it for good); False if stopped first."""
        refusals, pause = 0, PAUSE_SECONDS[0]
        while not self._stopped.is_set():
            try:
                self.apply(record.op, record.args)
            except Exception as error:
                if unanswered(error):
                    self._down(error)
                    self._stopped.wait(pause)
                    pause = min(pause * 1.5, PAUSE_SECONDS[1])
                    continue
                refusals += 1
                if refusals < REFUSALS:
                    self._stopped.wait(refusals)
                    continue
                log.warning(
                    "the MLflow tracking store %s refused %s %d times (%s: %s); it is left out of the "
                    "run. Fix: see the store's log for why.",
                    self.store,
                    describe(record),
                    refusals,
                    type(error).__name__,
                    reason(error),
                )
                return True
            self._up(record)
            return True
        return False

    def _down(self, error: BaseException) -> None:
        with self.journal.condition:
            if self.outage_since is not None:
                return
            self.outage_since = time.monotonic()
            self.journal.condition.notify_all()
        log.warning(
            "the MLflow tracking store %s stopped answering (%s). Training goes on: what the run logs "
            "is kept in %s and sent in order once the store answers again (a run that ends meanwhile "
            "waits for it until it has been down mlflow.outage_seconds=%g s).",
            self.store,
            reason(error),
            self.journal.path,
            self.outage_seconds,
        )

    def _up(self, record: Record) -> None:
        if self.outage_since is None:
            return
        with self.journal.condition:
            seconds, self.outage_since = time.monotonic() - self.outage_since, None
            left = self.journal.last_seq - record.seq
            self.journal.condition.notify_all()
        log.info(
            "the MLflow tracking store %s answers again after %.0f s; %d more record(s) logged meanwhile "
            "follow in order",
            self.store,
            seconds,
            left,
        )

    def wait(self, seq: int, give_up: Callable[[], bool]) -> bool:
        """Wait until every record up to `seq` is delivered: True. False once the store has not answered for
        outage_seconds (counted from when it stopped), or when give_up() says so (checked every second)."""
        told = False
        with self.journal.condition:
            while self.journal.delivered_seq < seq:
                if self.outage_since is not None:
                    remaining = self.outage_since + self.outage_seconds - time.monotonic()
                    if remaining <= 0:
                        return False
                    if not told:
                        told = True
                        log.warning(
                            "waiting up to %.0f s more for the MLflow tracking store %s to answer and "
                            "take the run's last %d record(s) (mlflow.outage_seconds=%g; Ctrl-C stops "
                            "waiting, and they stay in %s)",
                            remaining,
                            self.store,
                            seq - self.journal.delivered_seq,
                            self.outage_seconds,
                            self.journal.path,
                        )
                self.journal.condition.wait(1.0)
                if give_up():
                    return False
        return True

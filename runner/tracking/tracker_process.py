"""The chief's MLflow tracker in a process of its own.

Importing MLflow and opening its sqlite store take seconds, which in the training process would all be
spent before the first training step. A TrackerProcess is started before TensorFlow is imported: its
child imports MLflow and opens an existing store on the other core while the training process imports
TensorFlow, and no MLflow call holds the training process's GIL while it trains (only the model's export,
after the last epoch, imports MLflow there: runner.tracking.model_export). It has MlflowTracker's methods;
each runs in the child, and returns its result or raises its error here.

The child creates nothing until the first call (a job that fails during set-up leaves no tracking store
behind), ignores SIGINT and SIGTERM (the training process decides how the run ends: after a SIGTERM it
is KILLED and resumable), and exits when the training process closes the pipe or dies.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping

from runner.errors import RunnerError
from runner.settings import MlflowSettings
from runner.tracking.common import failure_message

log = logging.getLogger("runner")

# A close() waits this long for the child to end by itself before it is killed.
CLOSE_SECONDS = 30.0


class TrackerProcess:
    def __init__(self, settings: MlflowSettings):
        # spawn, not fork: safe whatever this process already runs (TensorFlow's threads, in tests).
        context = multiprocessing.get_context("spawn")
        self._connection, child_end = context.Pipe()
        self._process = context.Process(target=_serve, args=(child_end, settings), name="runner-mlflow-tracker")
        self._process.start()
        child_end.close()
        # Every exchange runs on this one thread: a signal handler that raises in the main thread
        # (SIGTERM's Preempted, Ctrl-C) then never leaves a reply half-read on the pipe.
        self._exchanges = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runner-tracker")
        self.run_id: str | None = None
        self.tracking_uri: str | None = None

    @property
    def pid(self) -> int:
        return self._process.pid

    def _exchange(self, method: str, args: tuple, kwargs: dict) -> tuple[bool, Any]:
        try:
            self._connection.send((method, args, kwargs))
            return self._connection.recv()
        except (EOFError, OSError):
            self._process.join(timeout=1)
            return False, RunnerError(
                f"the MLflow tracker process (pid {self._process.pid}) ended unexpectedly (exit code "
                f"{self._process.exitcode}) during {method}. Fix: see its error above, then re-run the same "
                "command with the same hydra.run.dir to resume from the last checkpoint.")

    def _call(self, method: str, *args, **kwargs) -> Any:
        ok, value = self._exchanges.submit(self._exchange, method, args, kwargs).result()
        if not ok:
            raise value
        return value

    # MlflowTracker's interface
    def start(self, run_dir: str, params: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> str:
        self.run_id = self._call("start", run_dir, dict(params), dict(tags) if tags else None)
        self.tracking_uri = self._call("tracking_uri")
        return self.run_id

    def log_text(self, text: str, artifact_file: str) -> None:
        self._call("log_text", text, artifact_file)

    def log_inputs(self, descriptions: list[dict[str, Any]]) -> None:
        self._call("log_inputs", list(descriptions))

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        self._call("log_artifact", path, artifact_path)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._call("log_metrics", {key: float(value) for key, value in metrics.items()}, step)

    def metric_histories(self) -> dict[str, list[tuple[int, float]]]:
        return self._call("metric_histories")

    def on_epoch_end(self, result) -> None:
        self.log_metrics(result.metrics(), step=result.epoch)

    def on_checkpoint_saved(self, epoch: int, files: list[str]) -> None:
        self._call("on_checkpoint_saved", epoch, list(files))

    def finish(self, error: BaseException | None = None, resumable: bool = False) -> None:
        # The error is put in words here: its object (a TensorFlow error) may not cross the pipe.
        self._call("end", None if error is None else failure_message(error, resumable), resumable)

    def close(self) -> None:
        """End the child once every call has been answered; kill it if it does not end in time."""
        self._exchanges.shutdown(wait=True)
        self._connection.close()
        self._process.join(timeout=CLOSE_SECONDS)
        if self._process.is_alive():
            log.warning("the MLflow tracker process (pid %d) did not end; killing it", self._process.pid)
            self._process.kill()
            self._process.join()


def _serve(connection, settings: MlflowSettings) -> None:
    """The child: one MlflowTracker, one call at a time, until the pipe closes."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    # The import this process exists to take off the training process's path:
    from runner.tracking.mlflow_tracker import MlflowTracker

    tracker = MlflowTracker(settings) if _store_exists(settings) else None
    if tracker is not None:
        tracker.client.get_experiment_by_name(settings.experiment_name)  # open the store now
    while True:
        try:
            method, args, kwargs = connection.recv()
        except (EOFError, OSError):  # the training process closed the pipe, or died
            return
        try:
            if tracker is None:
                tracker = MlflowTracker(settings)
            value = getattr(tracker, method)
            reply = (True, value(*args, **kwargs) if callable(value) else value)
        except Exception as error:  # it is the caller's error: raised there
            reply = (False, _picklable(error))
        connection.send(reply)


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

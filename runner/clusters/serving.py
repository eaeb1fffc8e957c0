"""The loop of a task that only serves: a parameter server, or a worker of parameter_server, which the
coordinator drives. It serves until the chief writes the job's end (runner.clusters.end_of_job), then ends
the process with the outcome that end gives."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from runner.clusters.end_of_job import END_FILE, SERVER_EXIT, read_end
from runner.clusters.roles import Task
from runner.config.schema import Settings
from runner.outcome import FAILED, FINISHED, KILLED, Outcome
from runner.strategy_kinds import strategy_kind

log = logging.getLogger("runner")

# A server asked to stop (SIGTERM) keeps serving so that the chief can save its checkpoint, but no longer.
SERVER_STOP_GRACE_SECONDS = 60.0
_POLL_SECONDS = 0.5


def serves(task_type: str, strategy: str) -> bool:
    """Whether a task of this type only serves (the coordinator runs the steps on it)."""
    return task_type == "ps" or (strategy_kind(strategy).coordinated and task_type == "worker")


def serve_if_a_server(task: Task, settings: Settings, run_dir: str, write: Callable[[Outcome], None]) -> None:
    """A task that only serves serves here until the chief is done, writes its outcome with `write` and ends
    the process; any other task returns at once."""
    if task.type is not None and serves(task.type, settings.strategy.name):
        serve(task, settings, run_dir, write)


def serve(task: Task, settings: Settings, run_dir: str, write: Callable[[Outcome], None]) -> NoReturn:
    """Serve until the chief writes a new END_FILE; then end with the status its outcome gives. SIGTERM
    (preemption) does not stop the server at once: the chief may still be saving its checkpoint."""
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: after the config is checked without it

    path = os.path.join(run_dir, END_FILE)
    earlier = read_end(path)  # a finished earlier run in this directory: not this cluster's end
    stop_requested: list[float] = []
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: stop_requested.append(time.monotonic()))
    resolver = task.resolver
    spec = resolver.cluster_spec()
    config = tf.compat.v1.ConfigProto()
    # TensorFlow's parameter server guide: a task serving N workers needs N + 1 inter-op threads, or
    # concurrent requests can wait on each other forever.
    config.inter_op_parallelism_threads = max(os.cpu_count() or 1, spec.num_tasks("worker") + 1)
    server = tf.distribute.Server(
        spec,
        job_name=task.type,
        task_index=task.index,
        protocol=resolver.rpc_layer or "grpc",
        config=config,
        start=True,
    )
    log.info(
        "%s of strategy=%s serving at %s until the chief is done (%s)",
        task.name,
        settings.strategy.name,
        server.target,
        path,
    )
    while True:
        end = read_end(path)
        if end is not None and end != earlier:
            ending = str(end.get("outcome"))
            code = SERVER_EXIT.get(ending, 1)
            log.info("the chief is done (%s): %s ends with status %d", ending, task.name, code)
            ended = _server_outcome(task, ending, code)
            break
        if stop_requested and time.monotonic() - stop_requested[0] > SERVER_STOP_GRACE_SECONDS:
            code = 128 + signal.SIGTERM
            said = (
                f"preempted: {task.name} stopped: SIGTERM {SERVER_STOP_GRACE_SECONDS:.0f} s ago and the chief did "
                "not say it was done"
            )
            log.info("%s", said.removeprefix("preempted: "))
            ended = Outcome(KILLED, code, said, resumable=True, task=task.name)
            break
        time.sleep(_POLL_SECONDS)
    write(ended)
    # A tf.distribute.Server cannot be stopped, and its threads would hold a normal exit: leave at once.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _server_outcome(task: Task, ending: str, code: int) -> Outcome:
    if ending == "finished":
        return Outcome(FINISHED, code, task=task.name)
    if ending == "preempted":
        return Outcome(
            KILLED, code, f"preempted: the chief was preempted, so {task.name} stopped", resumable=True, task=task.name
        )
    return Outcome(FAILED, code, f"error: the chief failed ({ending}), so {task.name} stopped", task=task.name)

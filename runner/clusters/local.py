"""cluster=local: start a whole TensorFlow cluster on this machine, watch it, and stop all of it.

Every task is `python -m runner <the same overrides> cluster=tf_config` in the same run directory, with
its own TF_CONFIG naming a free localhost port: cluster.workers workers for multi_worker_mirrored (worker
0 is the chief), or a chief (the coordinator), cluster.workers workers and cluster.ps parameter servers
for parameter_server. The chief's output streams through and its outcome (runner.outcome) is the job's; the
other tasks write to <run_dir>/tasks/<type>-<index>.log. Every task says how it ended in its own outcome file,
<run_dir>/outcome-<type>-<index>.json, which is all this launcher reads of it.

A task that dies: under parameter_server a worker is restarted (MAX_WORKER_RESTARTS times at most),
while the coordinator re-runs its steps on the other workers and rebuilds its dataset once it is back.
Any other task (a parameter server, a multi_worker_mirrored worker) stops the whole job with an error
naming it, and the chief's MLflow run is marked FAILED with that error. Tasks run in process groups of
their own, are stopped on every way out (the chief's end, a failure, Ctrl-C, SIGTERM), and die with
this process even if it is killed outright.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from hydra.core.override_parser.overrides_parser import OverridesParser

from runner import outcome
from runner.clusters.end_of_job import END_FILE, SERVER_EXIT, read_end
from runner.clusters.preemption import EXIT_CODE as _PREEMPTED  # what a preempted task exits with
from runner.config.schema import ClusterSettings, Settings
from runner.errors import RunnerError, report
from runner.outcome import FAILED, FINISHED, KILLED, OUTCOME_VARIABLE, Outcome, resume_advice
from runner.overrides import quoted
from runner.searchpath import searchpath_overrides
from runner.strategy_kinds import strategy_kind
from runner.tracking.lifecycle import failure_message
from runner.tracking.run_id_file import read_run_id

log = logging.getLogger("runner")

MAX_WORKER_RESTARTS = 3
POLL_SECONDS = 0.2
# After a task dies, the chief may still exit with its own error paragraph (a mistake every task hits).
FAILURE_GRACE_SECONDS = 3.0
# After a worker stopped for a preemption (it saved the agreed step with every other worker), how long the chief,
# which stops at the same step, has to end its MLflow run and say so: seconds under load.
PREEMPTION_GRACE_SECONDS = 60.0
# A task asked to stop (SIGTERM) may first save a checkpoint; after this it is killed (SIGKILL).
STOP_GRACE_SECONDS = 5.0
# After the chief finished or stopped for a preemption, how long the other tasks have to end by themselves (a
# worker saves the agreed step too, a server sees the chief's end) before they are asked to stop: a SIGTERM that
# reached a MultiWorkerMirrored worker still saving would find TensorFlow's preemption handler asking the chief's
# coordination service, gone with the chief, to note a second preemption.
FOLLOW_SECONDS = 20.0
# The command-line keys the launcher sets for its tasks itself.
_OWN_KEYS = ("cluster", "cluster.kind", "hydra.run.dir", "hydra.output_subdir")


@dataclass
class _Task:
    type: str
    index: int
    tf_config: str
    log_path: str | None  # None for the chief, whose output streams through
    outcome_file: str  # where it writes how it ended (runner.outcome)
    process: subprocess.Popen | None = None
    restarts: int = 0
    started: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.type} {self.index}"

    @property
    def popen(self) -> subprocess.Popen:
        """The task's process, once started."""
        assert self.process is not None, f"{self.name} is not started"
        return self.process


class _Stopped(Exception):
    """SIGINT or SIGTERM reached the launcher."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def launch(settings: Settings, hydra_config) -> Outcome:
    """Run the job on a cluster of local processes; return how it ended: the chief's outcome (its result when
    it finished, its own paragraph when it failed on its own, which it printed itself).

    Raises RunnerError when another task brought the job down, or the chief was killed."""
    run_dir = os.path.abspath(str(hydra_config.runtime.output_dir))
    command = [
        sys.executable,
        "-m",
        "runner",
        *searchpath_overrides(hydra_config),
        *_task_overrides(list(hydra_config.overrides.task), run_dir),
    ]
    tasks = _plan(settings.strategy.name, settings.cluster, run_dir)
    log.info(
        "cluster=local: strategy=%s with %s; the other tasks log to %s",
        settings.strategy.name,
        ", ".join(f"{t.name} at {_address(t)}" for t in tasks),
        os.path.join(run_dir, "tasks"),
    )
    cwd = str(hydra_config.runtime.cwd)
    chief_outcome, error, stopped_by = None, None, None
    previous = _install_stop_handlers()
    try:
        for task in reversed(tasks):  # the servers first, the chief (tasks[0]) last
            _start(task, command, cwd)
        # ClusterCoordinator survives a worker that dies and comes back; no other task can be replaced.
        replaceable = strategy_kind(settings.strategy.name).coordinated
        restart = (lambda task: _start(task, command, cwd)) if replaceable else None
        chief_outcome, error = _watch(tasks, restart, run_dir)
        if error is None and chief_outcome.status in (FINISHED, KILLED):
            _wait(tasks[1:], FOLLOW_SECONDS)
    except _Stopped as stop:
        stopped_by = stop
    finally:
        _ignore_stop_signals()
        try:
            _stop(tasks)
        finally:
            _restore_handlers(previous)
    if stopped_by is not None:
        code = tasks[0].process.returncode if tasks[0].process else None
        error = (
            f"the job was stopped by {stopped_by} before the chief finished; every task was stopped, the "
            f"chief first (it saves a checkpoint when it can). Fix: {resume_advice(run_dir)}, to resume from the "
            "last checkpoint."
        )
        _mark_failed(settings, run_dir, error, only_if_running=True)
        code = code if code and code > 0 else 128 + stopped_by.signum
        return Outcome(KILLED, code, report("error", error), resumable=True)
    if error is not None:
        _mark_failed(settings, run_dir, error)
        raise RunnerError(error)
    assert chief_outcome is not None
    # The job's outcome is the chief's: its paragraph, if any, was on the terminal already (its output streams
    # through).
    return replace(chief_outcome, task=None)


def _task_overrides(overrides: list[str], run_dir: str) -> list[str]:
    """The user's overrides, with the cluster and the run directory set for a task of this job."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    kept = [text for text, override in zip(overrides, parsed, strict=True) if override.key_or_group not in _OWN_KEYS]
    # hydra.output_subdir=null: the run directory's .hydra/ stays the launcher's (cluster=local).
    return [*kept, "cluster=tf_config", f"hydra.run.dir={quoted(run_dir)}", "hydra.output_subdir=null"]


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports."""
    sockets = []
    try:
        for _ in range(count):  # all held open at once, so no port is handed out twice
            sock = socket.socket()
            sock.bind(("localhost", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _plan(strategy: str, cluster: ClusterSettings, run_dir: str) -> list[_Task]:
    """The tasks and their TF_CONFIG, the chief first."""
    log_dir = os.path.join(run_dir, "tasks")
    if not strategy_kind(strategy).coordinated:  # MultiWorkerMirrored: every task a worker, the first the chief
        jobs = [("worker", cluster.workers)]
    else:
        jobs = [("chief", 1), ("worker", cluster.workers), ("ps", cluster.ps)]
    ports = iter(free_ports(sum(count for _, count in jobs)))
    spec = {job: [f"localhost:{next(ports)}" for _ in range(count)] for job, count in jobs}
    tasks: list[_Task] = []
    for job, count in jobs:
        for index in range(count):
            chief = not tasks
            tf_config = json.dumps({"cluster": spec, "task": {"type": job, "index": index}})
            log_path = None if chief else os.path.join(log_dir, f"{job}-{index}.log")
            tasks.append(_Task(job, index, tf_config, log_path, outcome.path(run_dir, job, index, environ={})))
    return tasks


def _address(task: _Task) -> str:
    config = json.loads(task.tf_config)
    return config["cluster"][task.type][task.index]


def _die_with_launcher() -> None:
    """In the child before exec: if the launcher is killed outright, the kernel kills the task too."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _start(task: _Task, command: list[str], cwd: str) -> None:
    env = {**os.environ, "TF_CONFIG": task.tf_config, "PYTHONUNBUFFERED": "1", OUTCOME_VARIABLE: task.outcome_file}
    outcome.forget(task.outcome_file)  # an earlier run's, or this task's before a restart
    output = None
    if task.log_path is not None:
        os.makedirs(os.path.dirname(task.log_path), exist_ok=True)
        output = open(task.log_path, "ab")
    try:
        task.process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
            start_new_session=True,  # its own process group: stopped as a whole, and Ctrl-C stays ours
            preexec_fn=_die_with_launcher if sys.platform.startswith("linux") else None,
        )
    finally:
        if output is not None:
            output.close()
    task.started = time.monotonic()


def _watch(tasks: list[_Task], restart: Callable[[_Task], None] | None, run_dir: str) -> tuple[Outcome, str | None]:
    """Wait for the chief. Return its outcome, and the paragraph saying why the job failed when the chief
    cannot say it itself (another task died, or the chief was killed)."""
    chief, others = tasks[0], list(tasks[1:])
    while True:
        code = chief.popen.poll()
        if code is not None:
            ended = _outcome(chief)
            if ended.status == FINISHED and code == 0:
                return ended, None
            if not os.path.exists(chief.outcome_file):  # killed, or dead before it could say why
                return ended, _died(chief, run_dir)
            dead = next(
                (
                    t
                    for t in others
                    if t.popen.poll() not in (None, 0) and not _followed_the_chief(t, t.popen.returncode, run_dir)
                ),
                None,
            )
            if dead is not None and not _same_mistake(code, dead.popen.returncode):
                return ended, _died(dead, run_dir)
            return ended, None  # the chief said why itself
        for task in list(others):
            status = task.popen.poll()
            if status is None:
                continue
            if status == 0:
                # A multi_worker_mirrored worker that finished its part, or a server that saw the chief's end.
                others.remove(task)
            elif _followed_the_chief(task, status, run_dir):
                others.remove(task)  # the chief ended the job and says why
            elif restart is not None and task.type == "worker" and task.restarts < MAX_WORKER_RESTARTS:
                task.restarts += 1
                # What it said of its end, if it could say anything (a worker killed outright wrote nothing).
                said = f": {_outcome(task).message}" if os.path.exists(task.outcome_file) else ""
                log.warning(
                    "%s died (%s%s); restarting it (%d of %d): meanwhile the coordinator runs its steps on "
                    "the other workers",
                    task.name,
                    _how(status),
                    said,
                    task.restarts,
                    MAX_WORKER_RESTARTS,
                )
                restart(task)
            else:
                grace = PREEMPTION_GRACE_SECONDS if status == _PREEMPTED else FAILURE_GRACE_SECONDS
                deadline = time.monotonic() + grace
                while chief.popen.poll() is None and time.monotonic() < deadline:
                    time.sleep(POLL_SECONDS)
                chief_code = chief.popen.returncode
                if chief_code is not None and _same_mistake(chief_code, status):
                    # A mistake every task made, or a preemption every worker stopped for: the chief said it.
                    return _outcome(chief), None
                ended = _outcome(chief) if chief_code is not None else Outcome(FAILED, 1)
                return replace(ended, exit_code=chief_code or 1), _died(task, run_dir)
        time.sleep(POLL_SECONDS)


def _outcome(task: _Task) -> Outcome:
    """How the task that ended says it ended (runner.outcome), or that it could not say."""
    return outcome.read(task.outcome_file, task.popen.returncode, who=f"{task.name} of the local cluster")


def _followed_the_chief(task: _Task, status: int, run_dir: str) -> bool:
    """A parameter_server cluster's server that ended as the chief's END_FILE of this cluster told it to
    (runner.clusters.serving): the chief, not the server, says why the job ended."""
    path = os.path.join(run_dir, END_FILE)
    end = read_end(path)
    if end is None or status == 0 or status != SERVER_EXIT.get(str(end.get("outcome"))):
        return False
    started = time.time() - (time.monotonic() - task.started)  # an earlier run's END_FILE is older than the task
    try:
        return os.path.getmtime(path) >= started - 1.0
    except OSError:
        return False


def _same_mistake(chief_status: int | None, task_status: int) -> bool:
    """Both exited 2 (a RunnerError paragraph): a mistake every task hit, which the chief explained; or both
    143: a MultiWorkerMirrored preemption, every worker stopping at the same step after its save. A
    task that was killed, or crashed, is the cause even when the chief then stopped with status 2 (its
    paragraph on the lost peer)."""
    return chief_status == task_status and task_status in (2, _PREEMPTED)


def _how(status: int) -> str:
    return f"killed by {signal.Signals(-status).name}" if status < 0 else f"exited with status {status}"


def _died(task: _Task, run_dir: str) -> str:
    seconds = time.monotonic() - task.started
    role = {"ps": " (a parameter server: the variables it held are gone)", "chief": " (the chief)"}.get(task.type, "")
    where = f"Its log: {task.log_path}. " if task.log_path else ""
    said = _outcome(task).message.rstrip(".")
    return (
        f"{task.name}{role} of the local cluster (pid {task.popen.pid}) {_how(task.popen.returncode)} "
        f"{seconds:.0f} s after it started ({said}), so every other task was stopped. "
        f"{where}Fix: find the cause in {'its log' if task.log_path else 'the output above'}, then "
        f"{resume_advice(run_dir)}, to resume from the last checkpoint."
    )


def _signal_group(task: _Task, signum: int) -> None:
    if task.process is None:
        return
    try:
        os.killpg(task.process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _wait(tasks: list[_Task], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(t.process is not None and t.process.poll() is None for t in tasks) and time.monotonic() < deadline:
        time.sleep(0.1)


def _stop(tasks: list[_Task]) -> None:
    """SIGTERM the chief first (its checkpoint may need the parameter servers), then the others;
    SIGKILL every process group after the grace period."""
    chief, others = tasks[0], tasks[1:]
    if chief.process is not None and chief.process.poll() is None:
        _signal_group(chief, signal.SIGTERM)
        _wait([chief], STOP_GRACE_SECONDS)
    for task in others:
        if task.process is not None and task.process.poll() is None:
            _signal_group(task, signal.SIGTERM)
    _wait(others, STOP_GRACE_SECONDS)
    for task in tasks:
        _signal_group(task, signal.SIGKILL)  # the whole group, whatever its leader did
        if task.process is not None:
            task.process.wait()


def _install_stop_handlers():
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, frame):
        raise _Stopped(signum)

    return {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}


def _ignore_stop_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)  # let the stop finish: it ends with SIGKILL anyway


def _restore_handlers(previous) -> None:
    for signum, handler in (previous or {}).items():
        signal.signal(signum, handler)


def _mark_failed(settings: Settings, run_dir: str, error: str, only_if_running: bool = False) -> None:
    """Mark the chief's MLflow run FAILED with the job's error: the chief is gone and cannot."""
    run_id = read_run_id(run_dir)
    if run_id is None:
        return  # the chief never started its run
    from runner.tracking.run_writer import fail_run  # noqa: PLC0415  MLflow: only to mark a failed run

    try:
        fail_run(settings.mlflow.tracking_uri, run_dir, run_id, failure_message(RunnerError(error)), only_if_running)
    except Exception as failure:  # the job's own error is what the user must see
        log.warning("could not mark the chief's MLflow run FAILED: %s", failure)

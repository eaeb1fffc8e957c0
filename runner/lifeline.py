"""A training process that a sweep started stops when the sweep is gone, as if it had been preempted.

A `kill -9` of a sweep, a closed terminal or a lost SSH session ends the sweep's process but not the training
processes its jobs started: they are re-parented to PID 1 and train on, holding their run directories and
reporting to trials nobody will tell. So a sweep job hands its training process a lifeline (LIFELINE_VARIABLE):
the processes it depends on, each named by its pid and its start time (a pid the kernel gives to a new process
is not mistaken for it). A thread of the training process looks at them every WATCH_SECONDS; once one is gone
it sends its own process SIGTERM, which the training handles as a preemption: it saves a checkpoint, ends its
MLflow run KILLED and resumable, and exits, leaving its trial for a re-run of the sweep to continue.

Only processes on this machine can be watched: the basic, joblib and submitit-local launchers'. Under SLURM and
Ray the engine owns the job (scancel, Ray's own semantics) and no lifeline is given.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

log = logging.getLogger("runner")

# Set by a sweep job for its training process: JSON, a list of Process.
LIFELINE_VARIABLE = "RUNNER_LIFELINE"
# Set by the sweep's command for every process it starts (JSON, one Process): the sweep itself.
SWEEP_PROCESS_VARIABLE = "RUNNER_SWEEP_PROCESS"
WATCH_SECONDS = 1.0


@dataclass(frozen=True)
class Process:
    """A process on this machine: its pid and its start time in clock ticks since boot (/proc/<pid>/stat)."""

    pid: int
    start: int | None

    @classmethod
    def of(cls, pid: int) -> Process:
        return cls(pid, _start_time(pid))

    @classmethod
    def this(cls) -> Process:
        return cls.of(os.getpid())

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process: it exists
            pass
        started = _start_time(self.pid)
        return self.start is None or started is None or started == self.start


def _start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (after the command name, which may hold spaces); None where /proc is not."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    try:
        return int(fields[19])  # fields[0] is field 3 (the state)
    except (IndexError, ValueError):
        return None


def lifeline(processes: Sequence[Process]) -> dict[str, str]:
    """The training process's environment entry that makes it stop once any of `processes` is gone."""
    return {LIFELINE_VARIABLE: json.dumps([asdict(process) for process in processes])}


def sweep_process(environ: Mapping[str, str] = os.environ) -> Process | None:
    """The sweep's own process, as its command recorded it for the processes it starts."""
    text = environ.get(SWEEP_PROCESS_VARIABLE)
    return Process(**json.loads(text)) if text else None


def record_sweep_process(environ=os.environ) -> None:
    """In the sweep's command, before Hydra starts any job: name this process for the jobs (inherited)."""
    environ[SWEEP_PROCESS_VARIABLE] = json.dumps(asdict(Process.this()))


def watch(
    environ: Mapping[str, str] = os.environ,
    period: float = WATCH_SECONDS,
    then: Callable[[Process], None] | None = None,
) -> threading.Thread | None:
    """Start the watch over the lifeline this process was given, if any (a daemon thread): once a process of it is
    gone, SIGTERM to this process (stop_as_preempted), or `then`."""
    text = environ.get(LIFELINE_VARIABLE)
    if not text:
        return None
    return _watching([Process(**item) for item in json.loads(text)], then or stop_as_preempted, period)


def exit_once_gone(process: Process, period: float = WATCH_SECONDS) -> None:
    """For a worker process of a pool the sweep started (joblib's loky workers, which outlive a killed parent and
    wait for its work for minutes): exit once the sweep's `process` is gone. A training process the worker had
    started watches the worker too, so it stops as it does when the sweep is gone. One watch per process."""
    if not _exiting:
        _exiting.append(_watching([process], _exit, period))


_exiting: list[threading.Thread] = []


def _watching(processes: Sequence[Process], then: Callable[[Process], None], period: float) -> threading.Thread:
    thread = threading.Thread(target=_watch, args=(processes, then, period), name="runner-lifeline", daemon=True)
    thread.start()
    return thread


def _watch(processes: Sequence[Process], then: Callable[[Process], None], period: float) -> None:
    stop = threading.Event()
    while not stop.wait(period):
        gone = next((process for process in processes if not process.alive()), None)
        if gone is not None:
            then(gone)
            return


def stop_as_preempted(gone: Process) -> None:
    log.warning(
        "the sweep that started this training is gone (pid %d ended): stopping as on SIGTERM, so that the run "
        "saves a checkpoint, ends KILLED and resumable, and a re-run of the sweep continues it",
        gone.pid,
    )
    os.kill(os.getpid(), signal.SIGTERM)


def _exit(gone: Process) -> None:
    log.warning("the sweep that started this worker is gone (pid %d ended): the worker exits", gone.pid)
    os._exit(1)

"""One job per run directory: a second `python -m runner` with the same hydra.run.dir is refused at once, and a
sweep job that finds its directory held waits for the holder instead.

Two processes in one run directory would write the same checkpoint files and log every epoch twice into
the same MLflow run. The holder keeps an exclusive flock(2) on `<run dir>/.runner.lock` (which names its
pid) for as long as it lives; the kernel drops it when the process ends, `kill -9` included, so a re-run
after a crash resumes as usual. Who takes it, and when, is runner.clusters.run_directory's (a Hydra callback).

A sweep re-run right after its sweep was killed can find a job's directory still held by the training process
the killed sweep started, which is stopping (runner.lifeline): the job waits for it (wait_while_held) instead
of failing its trial, then resumes the run it leaves.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable

from runner.errors import RunnerError

LOCK_FILE = ".runner.lock"

_held: list[int] = []  # descriptors of the locks this process holds, open until it exits


def hold(run_dir: str) -> None:
    """Lock run_dir for this process; refuse if another process holds it (unless it is this one's
    parent: the cluster=local launcher, holding it for its tasks)."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, LOCK_FILE)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _pid_in(descriptor)
        os.close(descriptor)
        if holder is not None and holder == os.getppid():
            return
        raise RunnerError(
            f"hydra.run.dir={run_dir} is in use by another runner process ({describe(holder)}, which holds "
            f"{path}): two processes in one run directory would write the same checkpoints and log each epoch "
            "twice into the same MLflow run. Fix: wait for that run to end (or stop it"
            f"{f': kill {holder}' if holder else ''}) and re-run this command to resume it, or leave "
            "hydra.run.dir unset (or pick another directory) to start a separate run."
        ) from None
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"{os.getpid()}\n".encode())
    _held.append(descriptor)


def release() -> None:
    """Let go of every run directory this process holds: a warm sweep worker's, once its trial has ended."""
    while _held:
        os.close(_held.pop())  # and the lock with it


def wait_while_held(run_dir: str, waiting: Callable[[int | None], None]) -> bool:
    """Block while another process holds run_dir, calling `waiting(its pid)` once first; return whether it did
    wait. The lock is let go at once: the process started next takes it."""
    path = os.path.join(run_dir, LOCK_FILE)
    try:
        descriptor = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            waiting(_pid_in(descriptor))
            fcntl.flock(descriptor, fcntl.LOCK_EX)  # until the holder ends (the kernel drops its lock then)
            return True
    finally:
        os.close(descriptor)  # and the lock with it


def _pid_in(descriptor: int) -> int | None:
    try:
        return int(os.pread(descriptor, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None


def describe(pid: int | None) -> str:
    """'pid 123: python -m runner ...' from /proc when it can be read."""
    if pid is None:
        return "its pid is not written yet"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return f"pid {pid}"
    return f"pid {pid}: {command[:200]}" if command else f"pid {pid}"

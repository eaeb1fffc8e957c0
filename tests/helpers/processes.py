"""Stopping a process that forks helpers (servers, browsers) and checking that none of them outlives it.

Each such process is started with start_new_session=True, so its pid is also the id of a process group
that holds everything it forked."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from helpers.waiting import holds_within


def _stat_fields():
    """(pid, the fields of /proc/<pid>/stat after the command name) for every process."""
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:  # it exited while we looked
            continue
        yield int(Path(stat).parent.name), fields


def live_members(group: int) -> list[int]:
    """Processes of a group that are still running (zombies waiting for their parent do not count)."""
    return [pid for pid, fields in _stat_fields() if int(fields[2]) == group and fields[0] not in ("Z", "X")]


def children(pid: int) -> list[int]:
    """The direct children of a process, from /proc."""
    return [child for child, fields in _stat_fields() if int(fields[1]) == pid]


def is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def settled(pid: int, quiet: float = 0.25) -> Callable[[], bool]:
    """A condition for wait_for: true once the process has slept without using any CPU time for `quiet` seconds,
    that is, it has done what it does on starting and now waits (a child started to take calls: on its pipe)."""
    seen = {"ticks": -1, "since": 0.0}

    def check() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            return False
        ticks, now = int(fields[11]) + int(fields[12]), time.monotonic()  # utime + stime
        if fields[0] != "S" or ticks != seen["ticks"]:
            seen["ticks"], seen["since"] = ticks, now
            return False
        return now - seen["since"] >= quiet

    return check


def wait_group(process: subprocess.Popen, timeout: float) -> bool:
    """Wait until no process of the group runs; True if that happened within timeout."""

    def group_gone() -> bool:
        process.poll()  # reap the leader itself, so that it does not linger as our zombie
        return not live_members(process.pid)

    return holds_within(group_gone, timeout, every=0.2)


def stop_group(process: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM to the whole group, SIGKILL to whatever is left after timeout; raise if anything of
    the group still runs after that."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:  # the group is already empty
            break
        if wait_group(process, timeout):
            break
    process.wait(timeout=timeout)
    left = live_members(process.pid)
    if left:
        raise RuntimeError(f"processes {left} of {process.args[0]} are still running after SIGKILL")


def find_process(environment: dict[str, str], argument: str) -> int | None:
    """A live process whose environment holds every `environment` item and whose command line has
    `argument` as one of its words (a SLURM task, a submitit job), or None. The srun that started such a
    task has the same words and the job's variables: it is never the one returned."""
    wanted = {f"{key}={value}".encode() for key, value in environment.items()}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                environ = set(handle.read().split(b"\0"))
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                command = handle.read().split(b"\0")
        except OSError:
            continue
        is_srun = os.path.basename(command[0]) == b"srun"
        if wanted <= environ and argument.encode() in command and not is_srun and is_running(int(name)):
            return int(name)
    return None

"""Waiting for a condition, never for a time: every test and helper that waits for something polls it here.

    wait_for(condition, timeout, what)  # its truthy value; AssertionError naming `what` after `timeout` seconds
    holds_within(condition, timeout)    # True or False, for a caller with a next step (SIGKILL after SIGTERM)
    exited(process, name)               # wait_for's `unless`: stop waiting at once when the process has ended
    StartLine                           # processes that start something at the same moment, once all are ready

A `time.sleep` left in a test is one that needs time itself to pass (an outage's length, a process that must stay
frozen a while, a check that something does not happen): each says so where it is.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T],
    timeout: float = 120.0,
    what: str = "",
    *,
    every: float = 0.05,
    unless: Callable[[], object] | None = None,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll `condition` every `every` seconds until it returns something truthy, and return that.

    Fails with an AssertionError naming `what` after `timeout` seconds, or at once when `unless` returns something
    truthy: the reason waiting is hopeless (the process that should get there has ended: `exited`). `detail`: more
    words for the failure, read when it fails (a log's tail)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        hopeless = unless() if unless is not None else None
        if hopeless or time.monotonic() >= deadline:
            message = f"{hopeless} before {what}" if hopeless else f"timed out after {timeout:g} s waiting for {what}"
            raise AssertionError(message + (f":\n{detail()}" if detail is not None else ""))
        time.sleep(every)


def holds_within(condition: Callable[[], object], timeout: float, every: float = 0.05) -> bool:
    """Whether `condition` comes to hold within `timeout` seconds (wait_for's poll, not failing)."""
    try:
        wait_for(condition, timeout, every=every)
    except AssertionError:
        return False
    return True


def exited(process: subprocess.Popen, name: str = "the process") -> Callable[[], str | None]:
    """For wait_for's `unless`: "<name> ended (<status>)" once `process` has exited, None while it runs."""
    return lambda: None if process.poll() is None else f"{name} ended ({process.returncode})"


class StartLine:
    """A start line in `directory` for processes that must do something at the same moment (open a fresh store,
    register a model): each runs `code()` once it is ready (it has imported what it needs), which marks it ready
    and waits for the go; `go(processes)` waits until every one of them is ready, then gives it."""

    def __init__(self, directory: Path):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def code(self) -> str:
        """Python source for a process to run at the line: "ready" as a file of its own, then the wait for "go"
        (a poll of 5 ms, so that they all start within milliseconds of each other)."""
        return (
            "import os as _os, time as _time\n"
            f"open(_os.path.join({str(self.directory)!r}, f'ready-{{_os.getpid()}}'), 'w').close()\n"
            f"while not _os.path.exists(_os.path.join({str(self.directory)!r}, 'go')):\n"
            "    _time.sleep(0.005)\n"
        )

    def go(self, processes: Sequence[subprocess.Popen], timeout: float = 120.0) -> None:
        """Once every process is at the line (failing if one ends first), let them all go."""

        def one_ended() -> str | None:
            return next((reason for process in processes if (reason := exited(process)())), None)

        def what_the_ended_said() -> str:  # an ended process's pipe reads to its end without waiting
            said = [process.stderr.read() for process in processes if process.poll() is not None and process.stderr]
            return "\n".join(str(text)[-3000:] for text in said)

        wait_for(
            lambda: len(list(self.directory.glob("ready-*"))) >= len(processes),
            timeout,
            f"{len(processes)} processes at the start line",
            unless=one_ended,
            detail=what_the_ended_said,
        )
        (self.directory / "go").touch()

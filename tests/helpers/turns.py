"""Whose turn it is on the machine's cores: the suite runs on two pytest-xdist workers (pyproject.toml's addopts),
so two tests usually run at once. A test that measures time (an outage's epoch times, a deadline for processes to
stop) is marked `@pytest.mark.alone` and runs while no other test runs; a test that times only a part of what it does
runs that part in `with alone_now():`, and the rest beside another test.

Two lock files shared by the workers (fcntl.flock, released by the kernel if a worker dies): every test holds the
room shared while it runs; a test that runs alone holds it exclusive. The turnstile in front of the room keeps a
waiting lone test from being overtaken: it holds the turnstile while it waits for the room, and every other test
passes the turnstile before entering. Without xdist (`-n 0`, or a single test run) nothing is locked.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

WORKERS_RUN = "PYTEST_XDIST_TESTRUNUID"  # set by pytest-xdist in each worker, the same for one test run's workers


def _directory(create: bool = True) -> Path | None:
    run = os.environ.get(WORKERS_RUN)
    if not run:
        return None
    directory = Path(tempfile.gettempdir()) / f"runner-tests-turns-{run}"
    if create:
        directory.mkdir(exist_ok=True)
    return directory


@contextmanager
def _locked(path: Path, mode: int) -> Iterator[None]:
    # The directory again if the other worker, done with its last test, removed it (clear) while this one runs.
    path.parent.mkdir(exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# The room's lock file as the running test holds it shared (None: not under xdist, or the test runs alone).
_shared_room: dict[str, Any] = {}


@contextmanager
def _turn(directory: Path, alone: bool) -> Iterator[None]:
    turnstile, room = directory / "turnstile.lock", directory / "room.lock"
    if alone:
        with _locked(turnstile, fcntl.LOCK_EX), _locked(room, fcntl.LOCK_EX):
            yield
        return
    with _locked(turnstile, fcntl.LOCK_EX):
        pass
    with open(room, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        _shared_room.update(handle=handle, turnstile=turnstile)
        try:
            yield
        finally:
            _shared_room.clear()
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def alone_now() -> Iterator[None]:
    """Inside a running test: the block runs while no other test runs (the test leaves the room, queues at the
    turnstile as a lone test does, and holds the room exclusive), then the test goes on beside another. The room is
    never held while waiting at the turnstile, so two tests doing this at once cannot wait on each other."""
    handle = _shared_room.get("handle")
    if handle is None:  # not under xdist, or the whole test runs alone
        yield
        return
    fcntl.flock(handle, fcntl.LOCK_UN)
    with _locked(_shared_room["turnstile"], fcntl.LOCK_EX):
        fcntl.flock(handle, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_SH)


def turn(alone: bool) -> AbstractContextManager[None]:
    """Hold this while a test runs (setup, call and teardown): alone, or beside another test."""
    directory = _directory()
    return nullcontext() if directory is None else _turn(directory, alone)


def clear() -> None:
    """When a worker has run its last test: the lock files go (the other worker, now alone, makes them again if it
    runs another test, and removes them in turn)."""
    directory = _directory(create=False)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)

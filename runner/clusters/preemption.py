"""SIGTERM, what Kubernetes and SLURM send before they preempt a job, as an exception at a safe point.

The handler only records the request. The training loop asks for it at every step boundary
(`check()`), and `deferred()` blocks (checkpoint writes, MLflow logging) raise it when they end, so
nothing is ever half-written. The handler itself never raises: an exception thrown at an arbitrary
bytecode could land inside library code that holds a lock or is half-way through an update (measured:
inside ClusterCoordinator's wait for a step's result it surfaced as "RuntimeError: release unlocked
lock" instead of a preemption).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

EXIT_CODE = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


class Preempted(Exception):
    """The job was asked to stop (SIGTERM); it saves a checkpoint and can be resumed."""


class PreemptionGuard:
    def __init__(self):
        self.requested = False
        self._critical = 0
        self._previous = None

    def _handle(self, signum, frame) -> None:
        self.requested = True

    @contextmanager
    def installed(self):
        """Record SIGTERM while the block runs (only the main thread may install handlers)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, self._previous)

    def check(self) -> None:
        """A safe point: raise Preempted if SIGTERM has arrived, unless inside a deferred() block."""
        if self.requested and not self._critical:
            raise Preempted("received SIGTERM")

    @contextmanager
    def deferred(self):
        """Hold a SIGTERM until the block is done."""
        self._critical += 1
        try:
            yield
        finally:
            self._critical -= 1
        self.check()

"""SIGTERM, what Kubernetes and SLURM send before they preempt a job, as an exception at a safe point.

The handler raises Preempted in the main thread at the next Python bytecode, which in the training
loop is a step boundary (a step runs inside one TensorFlow call). Inside `deferred()` blocks (checkpoint
writes, MLflow logging) it only records the request, and the exception is raised when the block ends,
so nothing is ever half-written.
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
        if not self._critical:
            raise Preempted("received SIGTERM")

    @contextmanager
    def installed(self):
        """Handle SIGTERM while the block runs (only the main thread may install handlers)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, self._previous)

    @contextmanager
    def deferred(self):
        """Hold a SIGTERM until the block is done."""
        self._critical += 1
        try:
            yield
        finally:
            self._critical -= 1
        if self.requested and not self._critical:
            raise Preempted("received SIGTERM")

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
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from runner.errors import Preempted

EXIT_CODE = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


class PreemptionGuard:
    def __init__(self):
        self.requested = False
        self.settled = False  # the run's result is reported: its ending runs to completion whatever comes
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
        """A safe point: raise Preempted if SIGTERM has arrived, unless inside a deferred() block or settled."""
        if self.requested and not self._critical and not self.settled:
            raise Preempted("received SIGTERM")

    def settle(self) -> None:
        """The run's result has been reported (a warm sweep worker answered its job): a SIGTERM from now on lets the
        rest of its ending (the model's export, the run's end: seconds) finish, rather than leaving a trial the
        sweep has counted with a run that is not FINISHED."""
        self.settled = True

    def at_step_boundary(self) -> None:
        """Where training may stop: after a step (or a call of steps)."""
        self.check()

    def training_done(self) -> None:
        """Every step is trained (the end actions follow)."""

    @contextmanager
    def watching(self, save: Callable[[], None], step: Callable[[], int]) -> Iterator[None]:
        """While training runs (the controller's block): `save` writes the checkpoint a preemption stops with and
        `step` reads the global step. A guard that stops its own process alone needs neither."""
        yield

    @contextmanager
    def deferred(self):
        """Hold a SIGTERM until the block is done."""
        self._critical += 1
        try:
            yield
        finally:
            self._critical -= 1
        self.check()


class AgreedStop(Preempted):
    """Every worker of a MultiWorkerMirrored job stopped at one agreed step and took part in its checkpoint."""

    def __init__(self, step: int, own: bool, signalled: str):
        super().__init__(f"stopped at global step {step} for the preemption of {signalled}")
        self.step = step
        self.own = own  # this process received the SIGTERM
        self.signalled = signalled  # the task that did


class CoordinatedPreemption(PreemptionGuard):
    """MultiWorkerMirrored: a SIGTERM to any one task stops every worker at the same step.

    A save needs every worker, and a worker that stops alone leaves its peers failing on the next
    collective. TensorFlow's PreemptionCheckpointHandler agrees on the step through the cluster's
    coordination service: the signalled task names the next step, every worker saves there (through
    `save`, the runner's own checkpoint) and stops with AgreedStop. A SIGTERM before the handler is
    installed stops this process alone, as PreemptionGuard does.
    """

    def __init__(self, resolver):
        super().__init__()
        self.resolver = resolver
        self.handler = None
        self._step: Callable[[], int] = lambda: 0  # the global step, for the words of the stop

    @contextmanager
    def watching(self, save: Callable[[], None], step: Callable[[], int]) -> Iterator[None]:
        """TensorFlow's handler, for as long as the controller trains: its SIGTERM handler replaces the one
        installed() put in place, which restores the one before both when its own block ends."""
        import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._step = step
        with tempfile.TemporaryDirectory(prefix="runner-preemption-") as scratch:
            # The handler restores from and counts its steps in a checkpoint of its own: an empty one here, since
            # the runner's checkpoints are written by `save` and restored by the Checkpointer.
            manager = tf.train.CheckpointManager(tf.train.Checkpoint(), scratch, max_to_keep=1)
            config = tf.distribute.experimental.TerminationConfig(exit_fn=self._stop, grace_period=0, save_fn=save)
            self.handler = tf.distribute.experimental.PreemptionCheckpointHandler(
                self.resolver, manager, termination_config=config
            )
            yield

    def at_step_boundary(self) -> None:
        self.check()
        if self.handler is not None:
            self.handler.save_checkpoint_if_preempted()

    def training_done(self) -> None:
        """Every worker has trained its last step: stop watching for the peers' preemption notices (TensorFlow
        does this only when the handler is garbage-collected, maybe after the coordination service is gone)."""
        if self.handler is not None:
            from runner.compat.tf_internals import stop_preemption_watchers  # noqa: PLC0415  TensorFlow: only once the config is valid

            stop_preemption_watchers(self.handler)

    def _stop(self) -> None:
        """The handler's exit_fn, called by every worker right after the agreed step's save."""
        from runner.compat.tf_internals import received_own_sigterm, terminated_worker  # noqa: PLC0415  TensorFlow: only once the config is valid

        assert self.handler is not None  # it calls this
        own = received_own_sigterm(self.handler)
        try:
            signalled = _task_name(self.resolver, terminated_worker())
        except Exception:  # noqa: BLE001 (the words only)
            signalled = "a task of the cluster"
        raise AgreedStop(self._step(), own, signalled)


def _task_name(resolver, id_in_cluster: str) -> str:
    """A task's name from TensorFlow's id_in_cluster (the chief is 0, then the workers in order)."""
    jobs = resolver.cluster_spec().as_dict()
    index = int(id_in_cluster)
    if "chief" in jobs:
        return "the chief" if index == 0 else f"worker {index - 1}"
    return f"worker {index}"

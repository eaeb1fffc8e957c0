"""The private names of TensorFlow the runner uses, in one place; tests/test_compat.py fails, naming TensorFlow's
version, when one of them changes.

- The checkpoint directory's state proto (`tensorflow.python.training.checkpoint_state_pb2`), which the runner reads
  and writes to list a run's checkpoints (runner.training.checkpoints).
- PreemptionCheckpointHandler's watcher threads and whether the SIGTERM was this task's own, and the coordination
  service's key that names the signalled task (runner.clusters.preemption).
- The count of how often each tf.function retraces (`_frequent_tracing_detector_manager` in
  tensorflow/python/eager/polymorphic_function/polymorphic_function.py).

TensorFlow counts a method's traces by its code object, which outlives the objects it was bound to: a warm sweep
worker (runner.warm_worker) that builds a fresh model and fresh steps for every run would be told from its second
run on that its steps "triggered tf.function retracing", which they did not within that run.
"""

from __future__ import annotations

from typing import Any

from tensorflow.python.eager import context
from tensorflow.python.eager.polymorphic_function import polymorphic_function
from tensorflow.python.training.checkpoint_state_pb2 import CheckpointState

__all__ = [
    "CheckpointState",
    "forget_tracing_counts",
    "received_own_sigterm",
    "stop_preemption_watchers",
    "terminated_worker",
]

# The coordination service's key under which PreemptionCheckpointHandler records the task that got the signal.
TERMINATED_WORKER_KEY = "TERMINATED_WORKER"


def stop_preemption_watchers(handler: Any) -> None:
    """Stop a PreemptionCheckpointHandler's threads that watch for the peers' preemption notices and the signal
    (TensorFlow stops them only when the handler is garbage-collected, maybe after the coordination service is
    gone)."""
    handler._stop_cluster_wise_termination_watcher_thread()
    handler._stop_poll_termination_signal_thread()


def received_own_sigterm(handler: Any) -> bool:
    """Whether this task got the SIGTERM the handler acted on (else a peer did)."""
    return bool(handler._received_own_sigterm.is_set())


def terminated_worker() -> str:
    """The id in the cluster (the chief is 0, then the workers) of the task the handler was told got the signal."""
    return str(context.context().get_config_key_value(TERMINATED_WORKER_KEY))


def forget_tracing_counts() -> None:
    """Start TensorFlow's retracing counts afresh (a new run in a warm worker)."""
    manager = polymorphic_function._frequent_tracing_detector_manager
    with manager._lock:
        manager._detectors.clear()

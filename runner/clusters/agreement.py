"""MultiWorkerMirrored: a stop that one task decides at an epoch boundary (the chief's pruner) taken by every worker.

Only the chief reports to a sweep's study, so only the chief learns that its trial is pruned; a chief that stopped
alone would leave its peers waiting in the next epoch's all-reduces. At each epoch's end every worker contributes
its own flag to one all-reduce over the cluster, as its steps do, and all of them stop if any flag was up.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf


def any_worker_stops(strategy: tf.distribute.Strategy) -> Callable[[bool], bool]:
    """The agreement every worker calls at the same point of every epoch with its own wish to stop: True on all of
    them if any task wished it (a sum over the replicas: collective all-reduces take sums)."""

    @tf.function
    def wishes(wish: tf.Tensor) -> tf.Tensor:
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(wish)), axis=None)

    return lambda wish: bool(wishes(tf.constant(1.0 if wish else 0.0)) > 0)

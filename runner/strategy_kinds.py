"""The distribution strategies a run trains under (the `strategy` group's `strategy.name`), each described once: the
processes and devices it trains on and what the runner does differently for it. The config's rules
(runner.config.settings), the trainer's parts (runner.training.build), the clusters (runner.clusters) and a sweep's
warm workers (runner.sweeps.launch.warm_pool) read these records instead of comparing names; building the
tf.distribute strategy itself is runner.training.strategy's.

A new strategy is an option file (conf/strategy/<name>.yaml), a row of STRATEGIES and its branch of
runner.training.strategy.build_strategy.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.errors import RunnerError


@dataclass(frozen=True)
class StrategyKind:
    """One strategy, as the runner treats it."""

    name: str
    # The TensorFlow cluster's jobs it trains in, the first ones those it needs a task of (a cluster=... of several
    # processes); (): it trains in this one process.
    cluster_jobs: tuple[str, ...] = ()
    # A TF_CONFIG of its cluster, as a refusal's example.
    tf_config_example: str = ""
    # ParameterServerStrategy: the chief's ClusterCoordinator schedules each step on a worker, which with the
    # parameter servers only serves; updates are asynchronous, an epoch has no natural end, a lost worker is replaced,
    # and the chief tells the servers the end.
    coordinated: bool = False
    # MultiWorkerMirroredStrategy: the workers all-reduce every step (strategy.communication), each reads its part of
    # the training set, and a stop (preemption, pruning) is agreed by all.
    all_reduces_across_processes: bool = False
    # Several replicas on this machine's CPU, split into logical devices (strategy.cpu_replicas).
    splits_the_cpu: bool = False
    # Its runs keep a process of their own: a sweep's warm worker never trains them (a cluster's tasks are processes
    # TensorFlow connects; a TPU's system is initialised once per process).
    own_process: bool = False
    # Its input pipeline runs in this process, so a pipeline may read a variable (the epoch) when it is iterated; a
    # TPU's runs on its host.
    pipeline_in_process: bool = True

    @property
    def multi_process(self) -> bool:
        """It trains in several processes that form a TensorFlow cluster."""
        return bool(self.cluster_jobs)


STRATEGIES: dict[str, StrategyKind] = {
    kind.name: kind
    for kind in (
        StrategyKind("default"),
        StrategyKind("one_device"),
        StrategyKind("mirrored", splits_the_cpu=True),
        StrategyKind("central_storage", splits_the_cpu=True),
        StrategyKind(
            "multi_worker_mirrored",
            cluster_jobs=("chief", "worker"),
            tf_config_example='{"cluster": {"worker": ["host0:12345", "host1:12345"]}, '
            '"task": {"type": "worker", "index": 0}}',
            all_reduces_across_processes=True,
            own_process=True,
        ),
        StrategyKind(
            "parameter_server",
            cluster_jobs=("chief", "worker", "ps"),
            tf_config_example='{"cluster": {"chief": ["host0:12345"], "worker": ["host1:12345", "host2:12345"], '
            '"ps": ["host3:12345"]}, "task": {"type": "chief", "index": 0}}',
            coordinated=True,
            own_process=True,
        ),
        StrategyKind("tpu", own_process=True, pipeline_in_process=False),
    )
}


def strategy_kind(name: str) -> StrategyKind:
    """The record of `strategy.name` (validated by the schema), or one paragraph naming the strategies."""
    kind = STRATEGIES.get(name)
    if kind is None:
        raise RunnerError(
            f"strategy={name!r} is not valid: the strategies are {', '.join(STRATEGIES)}. Fix: pick one of the "
            "strategy group's options."
        )
    return kind

"""Validated, typed settings built from the composed Hydra config.

This module imports no TensorFlow, so a mistyped value is rejected in a fraction of a second,
before any MLflow run exists. Every rejection is a RunnerError naming the value and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from runner.errors import RunnerError

STRATEGIES = (
    "default",
    "one_device",
    "mirrored",
    "central_storage",
    "multi_worker_mirrored",
    "parameter_server",
    "tpu",
)
MULTI_REPLICA_CPU_STRATEGIES = ("mirrored", "central_storage")
CROSS_DEVICE_OPS = ("nccl", "hierarchical_copy", "reduce_to_one")
DATASETS = ("fashion_mnist", "synthetic")
MODELS = ("cnn",)
OPTIMIZERS = ("adam",)
LR_RULES = ("none", "linear", "sqrt")
LOOP_STYLES = ("for_in", "iterator", "in_function", "multi_step")
RESUME_MODES = ("auto", "never")
MIXED_PRECISION_POLICIES = ("mixed_float16", "mixed_bfloat16")
MULTI_PROCESS_STRATEGIES = ("multi_worker_mirrored", "parameter_server")
COMMUNICATIONS = ("auto", "ring", "nccl")
CLUSTER_KINDS = ("none", "tf_config", "slurm", "local")


@dataclass(frozen=True)
class PartitionerSettings:
    """tf.distribute.experimental.partitioners.MinSizePartitioner's two arguments."""

    min_shard_bytes: int
    max_shards: int


@dataclass(frozen=True)
class StrategySettings:
    name: str
    devices: tuple[str, ...] | None
    cross_device_ops: str | None
    cpu_replicas: int | None
    tpu: str
    communication: str = "auto"  # multi_worker_mirrored's collective implementation
    variable_partitioner: PartitionerSettings | None = None  # parameter_server; None = whole variables


@dataclass(frozen=True)
class ClusterSettings:
    kind: str = "none"
    workers: int = 2
    ps: int = 1
    timeout_seconds: float | None = None
    port_base: int = 8888


@dataclass(frozen=True)
class DatasetSettings:
    name: str
    dir: str | None
    train_examples: int | None
    test_examples: int | None


@dataclass(frozen=True)
class ModelSettings:
    name: str
    weight_decay: float


@dataclass(frozen=True)
class OptimizerSettings:
    name: str
    lr: float


@dataclass(frozen=True)
class LrScalingSettings:
    rule: str
    base_batch: int
    warmup_epochs: float


@dataclass(frozen=True)
class LoopSettings:
    style: str
    steps_per_epoch: int | None
    steps_per_call: int


@dataclass(frozen=True)
class CheckpointSettings:
    every_epochs: int
    max_to_keep: int


@dataclass(frozen=True)
class RuntimeSettings:
    jit_compile: bool
    mixed_precision: str | None


@dataclass(frozen=True)
class MlflowSettings:
    tracking_uri: str | None
    experiment_name: str
    run_name: str | None


@dataclass(frozen=True)
class Settings:
    batch: int
    epochs: int
    seed: int
    progress: bool
    resume: str
    strategy: StrategySettings
    dataset: DatasetSettings
    model: ModelSettings
    optimizer: OptimizerSettings
    lr_scaling: LrScalingSettings
    loop: LoopSettings
    checkpoint: CheckpointSettings
    runtime: RuntimeSettings
    mlflow: MlflowSettings
    cluster: ClusterSettings = ClusterSettings()


def _fail(key: str, value: Any, why: str, fix: str) -> RunnerError:
    return RunnerError(f"{key}={value!r} is not valid: {why}. Fix: {fix}")


def _int(key: str, value: Any, *, minimum: int, fix: str, nullable: bool = False) -> int | None:
    if value is None and nullable:
        return None
    # bool is an int in Python, and "64" from a YAML string is not what the user meant either.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        need = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise _fail(key, value, f"it must be {need}" + (" or null" if nullable else ""), fix)
    return value


def _number(key: str, value: Any, *, minimum: float, fix: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise _fail(key, value, f"it must be a number >= {minimum}", fix)
    return float(value)


def _choice(key: str, value: Any, choices: tuple[str, ...], fix: str, nullable: bool = False):
    if value is None and nullable:
        return None
    if value not in choices:
        options = ", ".join(choices) + (", null" if nullable else "")
        raise _fail(key, value, f"the options are {options}", fix)
    return value


def _strategy(node: Mapping[str, Any]) -> StrategySettings:
    name = _choice("strategy", node["name"], STRATEGIES, "pick one of the strategy group's options")
    devices = node.get("devices")
    if devices is not None:
        if isinstance(devices, str) or not all(isinstance(d, str) for d in devices) or not devices:
            raise _fail(
                "strategy.devices", devices, "it must be a non-empty list of device names or null",
                "pass e.g. 'strategy.devices=[/cpu:0]' or strategy.devices=null to auto-detect",
            )
        devices = tuple(devices)
    cross = _choice(
        "strategy.cross_device_ops", node.get("cross_device_ops"), CROSS_DEVICE_OPS,
        "use one of the listed all-reduce implementations or null for TensorFlow's choice", nullable=True,
    )
    cpu_replicas = _int(
        "strategy.cpu_replicas", node.get("cpu_replicas"), minimum=1, nullable=True,
        fix="pass a positive number of logical CPU devices, e.g. strategy.cpu_replicas=2",
    )
    if cpu_replicas is not None and name not in MULTI_REPLICA_CPU_STRATEGIES:
        raise _fail(
            "strategy.cpu_replicas", cpu_replicas,
            f"strategy={name} cannot use several CPU replicas on one machine",
            "use strategy=mirrored or strategy=central_storage with it, or drop strategy.cpu_replicas",
        )
    if cpu_replicas is not None and devices is not None:
        raise _fail(
            "strategy.cpu_replicas", cpu_replicas, "it conflicts with the explicit strategy.devices list",
            "give either strategy.devices or strategy.cpu_replicas, not both",
        )
    tpu = node.get("tpu") or ""
    if not isinstance(tpu, str):
        raise _fail("strategy.tpu", tpu, "it must be a TPU name or address", "pass strategy.tpu=my-tpu or ''")
    communication = _choice(
        "strategy.communication", node.get("communication", "auto"), COMMUNICATIONS,
        "use auto (TensorFlow's choice), ring (gRPC, any device) or nccl (GPUs)",
    )
    if communication != "auto" and name != "multi_worker_mirrored":
        raise _fail(
            "strategy.communication", communication, f"strategy={name} does not all-reduce across processes",
            "use it with strategy=multi_worker_mirrored, or drop strategy.communication",
        )
    return StrategySettings(name, devices, cross, cpu_replicas, tpu, communication,
                            _partitioner(node.get("variable_partitioner") or {}, name))


def _partitioner(node: Mapping[str, Any], strategy: str) -> PartitionerSettings | None:
    max_shards = _int(
        "strategy.variable_partitioner.max_shards", node.get("max_shards"), minimum=1, nullable=True,
        fix="pass the most shards a variable may be split into (e.g. the number of ps tasks), or null for none",
    )
    min_shard_bytes = _int(
        "strategy.variable_partitioner.min_shard_bytes", node.get("min_shard_bytes", 256 << 10), minimum=1,
        fix="pass the smallest shard size in bytes, e.g. strategy.variable_partitioner.min_shard_bytes=262144",
    )
    if max_shards is None:
        return None
    if strategy != "parameter_server":
        raise _fail(
            "strategy.variable_partitioner.max_shards", max_shards,
            f"strategy={strategy} keeps whole variables (only parameter servers hold shards)",
            "use it with strategy=parameter_server, or set it to null",
        )
    return PartitionerSettings(min_shard_bytes, max_shards)


def _cluster(node: Mapping[str, Any], strategy: str, loop: Mapping[str, Any]) -> ClusterSettings:
    kind = _choice(
        "cluster.kind", node.get("kind", "none"), CLUSTER_KINDS,
        "pick one of the cluster group's options: cluster=local starts a cluster on this machine, "
        "cluster=tf_config or cluster=slurm join one started by Kubernetes, by hand or by srun",
    )
    settings = ClusterSettings(
        kind=kind,
        workers=_int("cluster.workers", node.get("workers", 2), minimum=1,
                     fix="pass the number of worker processes, e.g. cluster.workers=2"),
        ps=_int("cluster.ps", node.get("ps", 1), minimum=1,
                fix="pass the number of parameter server processes, e.g. cluster.ps=1"),
        timeout_seconds=None if node.get("timeout_seconds") is None else _number(
            "cluster.timeout_seconds", node["timeout_seconds"], minimum=1,
            fix="pass how long one all-reduce may wait for a peer, e.g. cluster.timeout_seconds=600, or null"),
        port_base=_int("cluster.port_base", node.get("port_base", 8888), minimum=1,
                       fix="pass a free TCP port for the first task on each node, e.g. cluster.port_base=8888"),
    )
    if kind == "none" and strategy in MULTI_PROCESS_STRATEGIES:
        raise _fail(
            "cluster", kind, f"strategy={strategy} trains in several processes that form a TensorFlow cluster",
            "add cluster=local to start one on this machine (cluster.workers=2, and cluster.ps=1 for "
            "parameter_server), or cluster=tf_config / cluster=slurm where TF_CONFIG or srun describe the cluster",
        )
    if kind != "none" and strategy not in MULTI_PROCESS_STRATEGIES:
        raise _fail(
            "cluster", kind, f"strategy={strategy} trains in a single process",
            "use strategy=multi_worker_mirrored or strategy=parameter_server with a cluster, or drop the "
            "cluster override",
        )
    if strategy == "parameter_server" and loop.get("steps_per_epoch") is None:
        raise _fail(
            "loop.steps_per_epoch", None,
            "strategy=parameter_server has no natural end of an epoch (each worker draws batches from its "
            "own endless dataset)", "pass a fixed number of steps per epoch, e.g. loop.steps_per_epoch=50",
        )
    return settings


def _dataset(node: Mapping[str, Any]) -> DatasetSettings:
    name = _choice("dataset", node["name"], DATASETS, "pick one of the dataset group's options")
    directory = node.get("dir")
    if directory is not None:
        directory = os.path.expanduser(str(directory))
        if not os.path.isdir(directory):
            raise _fail(
                "dataset.dir", directory, "no such directory",
                "point dataset.dir at the directory holding the four Fashion-MNIST IDX files "
                "(train-images-idx3-ubyte.gz, ...), or leave it null to use tf.keras.datasets",
            )
    counts = {
        key: _int(
            f"dataset.{key}", node.get(key), minimum=1, nullable=True,
            fix=f"pass a positive number of examples, e.g. dataset.{key}=1000, or null for all",
        )
        for key in ("train_examples", "test_examples")
    }
    return DatasetSettings(name=name, dir=directory, **counts)


def _loop(node: Mapping[str, Any]) -> LoopSettings:
    style = _choice("loop", node["style"], LOOP_STYLES, "pick one of the loop group's options")
    steps_per_epoch = _int(
        "loop.steps_per_epoch", node.get("steps_per_epoch"), minimum=1, nullable=True,
        fix="pass a positive number of steps, or null for one pass over the training set",
    )
    steps_per_call = _int(
        "loop.steps_per_call", node.get("steps_per_call", 1), minimum=1,
        fix="pass a positive number of steps per tf.function call, e.g. loop.steps_per_call=20",
    )
    return LoopSettings(style, steps_per_epoch, steps_per_call)


def _runtime(node: Mapping[str, Any]) -> RuntimeSettings:
    jit_compile = node.get("jit_compile", False)
    if not isinstance(jit_compile, bool):
        raise _fail("runtime.jit_compile", jit_compile, "it must be true or false", "pass runtime.jit_compile=true")
    policy = _choice(
        "runtime.mixed_precision", node.get("mixed_precision"), MIXED_PRECISION_POLICIES,
        "use mixed_bfloat16 on CPUs with AMX/AVX512-BF16 and TPUs, mixed_float16 on GPUs, or null", nullable=True,
    )
    return RuntimeSettings(jit_compile, policy)


def from_config(cfg: Mapping[str, Any]) -> Settings:
    """Validate a composed config (a resolved DictConfig or plain mapping) into Settings."""
    strategy = _strategy(cfg["strategy"])
    model = cfg["model"]
    optimizer = cfg["optimizer"]
    lr_scaling = cfg["lr_scaling"]
    checkpoint = cfg["checkpoint"]
    mlflow = cfg["mlflow"]
    return Settings(
        batch=_int("batch", cfg["batch"], minimum=1,
                   fix="pass the per-replica batch size as a positive integer, e.g. batch=64"),
        epochs=_int("epochs", cfg["epochs"], minimum=1, fix="pass a positive number of epochs, e.g. epochs=2"),
        seed=_int("seed", cfg["seed"], minimum=0, fix="pass a non-negative integer seed, e.g. seed=42"),
        progress=bool(cfg.get("progress", True)),
        resume=_choice("resume", cfg.get("resume", "auto"), RESUME_MODES,
                       "use resume=auto to continue from a run directory's checkpoints, resume=never to refuse"),
        strategy=strategy,
        dataset=_dataset(cfg["dataset"]),
        model=ModelSettings(
            name=_choice("model", model["name"], MODELS, "pick one of the model group's options"),
            weight_decay=_number("model.weight_decay", model["weight_decay"], minimum=0.0,
                                 fix="pass a non-negative L2 factor, e.g. model.weight_decay=1e-5"),
        ),
        optimizer=OptimizerSettings(
            name=_choice("optimizer", optimizer["name"], OPTIMIZERS, "pick one of the optimizer group's options"),
            lr=_number("optimizer.lr", optimizer["lr"], minimum=0.0,
                       fix="pass a positive learning rate, e.g. optimizer.lr=0.001"),
        ),
        lr_scaling=LrScalingSettings(
            rule=_choice("lr_scaling.rule", lr_scaling["rule"], LR_RULES, "use lr_scaling=none, linear or sqrt"),
            base_batch=_int("lr_scaling.base_batch", lr_scaling["base_batch"], minimum=1,
                            fix="pass the global batch the base learning rate was tuned for, e.g. 64"),
            warmup_epochs=_number("lr_scaling.warmup_epochs", lr_scaling["warmup_epochs"], minimum=0.0,
                                  fix="pass a number of epochs >= 0 (0 turns warm-up off)"),
        ),
        loop=_loop(cfg["loop"]),
        checkpoint=CheckpointSettings(
            every_epochs=_int("checkpoint.every_epochs", checkpoint["every_epochs"], minimum=1,
                              fix="pass a positive number of epochs between checkpoints"),
            max_to_keep=_int("checkpoint.max_to_keep", checkpoint["max_to_keep"], minimum=1,
                             fix="pass how many checkpoints to keep, e.g. 3"),
        ),
        runtime=_runtime(cfg["runtime"]),
        mlflow=MlflowSettings(
            tracking_uri=mlflow.get("tracking_uri") or None,
            experiment_name=str(mlflow["experiment_name"]),
            run_name=mlflow.get("run_name"),
        ),
        cluster=_cluster(cfg.get("cluster") or {}, strategy.name, cfg["loop"]),
    )

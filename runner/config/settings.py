"""Validated, typed settings built from the composed Hydra config.

This module imports no TensorFlow, so a mistyped value is rejected in a fraction of a second,
before any MLflow run exists. Every rejection is a RunnerError naming the value and the fix.
"""

from __future__ import annotations

import glob
import math
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, overload

from runner.config.components import Component
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
# The keys of the dataset group that the runner applies to any dataset; the others are its callable's arguments.
DATASET_KEYS = ("_target_", "name", "train_examples", "test_examples", "scale")
TARGET_GROUPS = ("model", "optimizer", "schedule", "loss", "dataset")
LR_RULES = ("none", "linear", "sqrt")
LOOP_STYLES = ("for_in", "iterator", "in_function", "multi_step")
RESUME_MODES = ("auto", "never")
CHECKPOINT_UPLOADS = ("last", "all", "none")  # mlflow.checkpoints: which checkpoints the MLflow run's artifacts hold
MIXED_PRECISION_POLICIES = ("mixed_float16", "mixed_bfloat16")
MULTI_PROCESS_STRATEGIES = ("multi_worker_mirrored", "parameter_server")
COMMUNICATIONS = ("auto", "ring", "nccl")
CLUSTER_KINDS = ("none", "tf_config", "slurm", "local")
# Shorter sampling intervals mostly measure the sampling and flood the tracking store.
MIN_SAMPLING_SECONDS = 0.1
# The stores MLflow 3 tracks into (its file store only reads); a driver may follow a '+' (postgresql+psycopg2).
TRACKING_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc", "uc")


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
    communication: str  # multi_worker_mirrored's collective implementation
    variable_partitioner: PartitionerSettings | None  # parameter_server; None = whole variables


@dataclass(frozen=True)
class ClusterSettings:
    kind: str
    workers: int
    ps: int
    timeout_seconds: float | None
    port_base: int


@dataclass(frozen=True)
class DatasetSettings:
    name: str
    component: Component  # the callable returning the data (runner.data.source), with its arguments
    train_examples: int | None
    test_examples: int | None
    scale: float


@dataclass(frozen=True)
class OptimizerSettings:
    component: Component  # called with learning_rate=
    lr: float  # the base learning rate, before lr_scaling and the schedule


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
    deterministic: bool  # op determinism, and refuse what cannot be reproduced bit for bit


@dataclass(frozen=True)
class SystemMetricsSettings:
    """MLflow's system metrics (CPU, memory, GPU under `system/`), sampled by the process that tracks."""

    enabled: bool
    interval_seconds: float


@dataclass(frozen=True)
class MlflowSettings:
    tracking_uri: str | None
    experiment_name: str
    run_name: str | None
    registered_model_name: str  # where a sweep's best model (and a registering run's) goes
    register: bool  # a single run registers its own model
    log_model: bool  # the run ends by logging its trained model as an MLflow Model
    system_metrics: SystemMetricsSettings
    # Which checkpoints go to the run's artifacts: last (the newest, when the run ends), all (each save), none.
    checkpoints: str
    # How long the tracking server may stop answering before a process that ends with data undelivered stops
    # waiting for it (the data then stays in the run directory's journal: runner.tracking.journal).
    outage_seconds: float


@dataclass(frozen=True)
class InitSettings:
    """init.from: where the model's weights come from before step 1 (runner.training.warm_start)."""

    source: str | None  # None: the model's own initialisation; else a URI, or a checkpoint's path
    kind: str | None  # checkpoint (an absolute path: a checkpoint prefix or a directory of them) | runs | models


@dataclass(frozen=True)
class Settings:
    batch: int
    epochs: int
    seed: int
    progress: bool | None  # None: the bar only when stderr is a terminal
    resume: str
    strategy: StrategySettings
    dataset: DatasetSettings
    model: Component  # called with input_shape= and num_classes=
    optimizer: OptimizerSettings
    lr_scaling: LrScalingSettings
    loop: LoopSettings
    checkpoint: CheckpointSettings
    runtime: RuntimeSettings
    mlflow: MlflowSettings
    cluster: ClusterSettings
    verbose: bool  # every library's INFO lines on the terminal (runner.verbosity)
    sweep_seeds: int  # a sweep trains every point with this many seeds: seed, seed+1, ...
    schedule: Component
    loss: Component
    init: InitSettings


def _fail(key: str, value: Any, why: str, fix: str) -> RunnerError:
    return RunnerError(f"{key}={value!r} is not valid: {why}. Fix: {fix}")


@overload
def _int(
    key: str, value: Any, *, minimum: int, fix: str, nullable: Literal[False] = False, maximum: int | None = None
) -> int: ...
@overload
def _int(key: str, value: Any, *, minimum: int, fix: str, nullable: bool, maximum: int | None = None) -> int | None: ...
def _int(
    key: str, value: Any, *, minimum: int, fix: str, nullable: bool = False, maximum: int | None = None
) -> int | None:
    if value is None and nullable:
        return None
    # bool is an int in Python, and "64" from a YAML string is not what the user meant either.
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        need = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        if maximum is not None:
            need = f"an integer from {minimum} to {maximum}"
        raise _fail(key, value, f"it must be {need}" + (" or null" if nullable else ""), fix)
    return value


def _number(key: str, value: Any, *, minimum: float, fix: str, positive: bool = False) -> float:
    """A finite number >= minimum (> minimum if `positive`): NaN and infinity compare as no user means."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or (value <= minimum if positive else value < minimum)
    ):
        raise _fail(key, value, f"it must be a finite number {'>' if positive else '>='} {minimum}", fix)
    return float(value)


@overload
def _bool(key: str, value: Any, fix: str, nullable: Literal[False] = False) -> bool: ...
@overload
def _bool(key: str, value: Any, fix: str, nullable: bool) -> bool | None: ...
def _bool(key: str, value: Any, fix: str, nullable: bool = False) -> bool | None:
    if nullable and value is None:
        return None
    if not isinstance(value, bool):
        raise _fail(key, value, "it must be true or false" + (" or null" if nullable else ""), fix)
    return value


@overload
def _text(key: str, value: Any, fix: str, nullable: Literal[False] = False) -> str: ...
@overload
def _text(key: str, value: Any, fix: str, nullable: bool) -> str | None: ...
def _text(key: str, value: Any, fix: str, nullable: bool = False) -> str | None:
    """A non-empty string (a number is taken as its digits); '' or null is None where `nullable`."""
    if nullable and (value is None or value == ""):
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        need = "a non-empty string" + (" or null" if nullable else "")
        raise _fail(key, value, f"it must be {need}", fix)
    return value


def _section(cfg: Mapping[str, Any], key: str, parent: str = "") -> Mapping[str, Any]:
    """A group of settings (strategy, checkpoint, ...): an override that replaced it by a value is refused."""
    node = cfg.get(key)
    if not isinstance(node, Mapping):
        name = parent + key
        raise _fail(
            name,
            node,
            "it is a group of settings, not a value",
            f"set the group's keys one at a time (e.g. {name}.<key>=<value>)"
            + ("" if parent else f", or pick one of its options with {key}=<option> where conf/{key}/ has options"),
        )
    return node


def _choice(key: str, value: Any, choices: tuple[str, ...], fix: str, nullable: bool = False):
    if value is None and nullable:
        return None
    if value not in choices:
        options = ", ".join(choices) + (", null" if nullable else "")
        raise _fail(key, value, f"the options are {options}", fix)
    return value


def _strategy(node: Mapping[str, Any]) -> StrategySettings:
    name = _choice("strategy", node.get("name"), STRATEGIES, "pick one of the strategy group's options")
    devices = node.get("devices")
    if devices is not None:
        if not isinstance(devices, (list, tuple)) or not all(isinstance(d, str) and d for d in devices) or not devices:
            raise _fail(
                "strategy.devices",
                devices,
                "it must be a non-empty list of device names or null",
                "pass e.g. 'strategy.devices=[/cpu:0]' or strategy.devices=null to auto-detect",
            )
        devices = tuple(devices)
    cross = _choice(
        "strategy.cross_device_ops",
        node.get("cross_device_ops"),
        CROSS_DEVICE_OPS,
        "use one of the listed all-reduce implementations or null for TensorFlow's choice",
        nullable=True,
    )
    cpu_replicas = _int(
        "strategy.cpu_replicas",
        node.get("cpu_replicas"),
        minimum=1,
        nullable=True,
        fix="pass a positive number of logical CPU devices, e.g. strategy.cpu_replicas=2",
    )
    if cpu_replicas is not None and name not in MULTI_REPLICA_CPU_STRATEGIES:
        raise _fail(
            "strategy.cpu_replicas",
            cpu_replicas,
            f"strategy={name} cannot use several CPU replicas on one machine",
            "use strategy=mirrored or strategy=central_storage with it, or drop strategy.cpu_replicas",
        )
    if cpu_replicas is not None and devices is not None:
        raise _fail(
            "strategy.cpu_replicas",
            cpu_replicas,
            "it conflicts with the explicit strategy.devices list",
            "give either strategy.devices or strategy.cpu_replicas, not both",
        )
    tpu = "" if node.get("tpu") is None else node.get("tpu")
    if not isinstance(tpu, str):
        raise _fail("strategy.tpu", tpu, "it must be a TPU name or address", "pass strategy.tpu=my-tpu or ''")
    communication = _choice(
        "strategy.communication",
        node.get("communication"),
        COMMUNICATIONS,
        "use auto (TensorFlow's choice), ring (gRPC, any device) or nccl (GPUs)",
    )
    if communication != "auto" and name != "multi_worker_mirrored":
        raise _fail(
            "strategy.communication",
            communication,
            f"strategy={name} does not all-reduce across processes",
            "use it with strategy=multi_worker_mirrored, or drop strategy.communication",
        )
    partitioner = None
    if node.get("variable_partitioner") is not None:
        partitioner = _partitioner(_section(node, "variable_partitioner", "strategy."), name)
    return StrategySettings(name, devices, cross, cpu_replicas, tpu, communication, partitioner)


def _partitioner(node: Mapping[str, Any], strategy: str) -> PartitionerSettings | None:
    max_shards = _int(
        "strategy.variable_partitioner.max_shards",
        node.get("max_shards"),
        minimum=1,
        nullable=True,
        fix="pass the most shards a variable may be split into (e.g. the number of ps tasks), or null for none",
    )
    min_shard_bytes = _int(
        "strategy.variable_partitioner.min_shard_bytes",
        node.get("min_shard_bytes"),
        minimum=1,
        fix="pass the smallest shard size in bytes, e.g. strategy.variable_partitioner.min_shard_bytes=262144",
    )
    if max_shards is None:
        return None
    if strategy != "parameter_server":
        raise _fail(
            "strategy.variable_partitioner.max_shards",
            max_shards,
            f"strategy={strategy} keeps whole variables (only parameter servers hold shards)",
            "use it with strategy=parameter_server, or set it to null",
        )
    return PartitionerSettings(min_shard_bytes, max_shards)


def _cluster(node: Mapping[str, Any], strategy: str, loop: Mapping[str, Any]) -> ClusterSettings:
    kind = _choice(
        "cluster.kind",
        node.get("kind"),
        CLUSTER_KINDS,
        "pick one of the cluster group's options: cluster=local starts a cluster on this machine, "
        "cluster=tf_config or cluster=slurm join one started by Kubernetes, by hand or by srun",
    )
    settings = ClusterSettings(
        kind=kind,
        workers=_int(
            "cluster.workers",
            node.get("workers"),
            minimum=1,
            fix="pass the number of worker processes, e.g. cluster.workers=2",
        ),
        ps=_int(
            "cluster.ps",
            node.get("ps"),
            minimum=1,
            fix="pass the number of parameter server processes, e.g. cluster.ps=1",
        ),
        timeout_seconds=None
        if node.get("timeout_seconds") is None
        else _number(
            "cluster.timeout_seconds",
            node["timeout_seconds"],
            minimum=1,
            fix="pass how long one all-reduce may wait for a peer, e.g. cluster.timeout_seconds=600, or null",
        ),
        port_base=_int(
            "cluster.port_base",
            node.get("port_base"),
            minimum=1,
            maximum=65535,
            fix="pass a free TCP port for the first task on each node, e.g. cluster.port_base=8888",
        ),
    )
    if kind == "none" and strategy in MULTI_PROCESS_STRATEGIES:
        raise _fail(
            "cluster",
            kind,
            f"strategy={strategy} trains in several processes that form a TensorFlow cluster",
            "add cluster=local to start one on this machine (cluster.workers=2, and cluster.ps=1 for "
            "parameter_server), or cluster=tf_config / cluster=slurm where TF_CONFIG or srun describe the cluster",
        )
    if kind != "none" and strategy not in MULTI_PROCESS_STRATEGIES:
        raise _fail(
            "cluster",
            kind,
            f"strategy={strategy} trains in a single process",
            "use strategy=multi_worker_mirrored or strategy=parameter_server with a cluster, or drop the "
            "cluster override",
        )
    if strategy == "parameter_server" and loop.get("steps_per_epoch") is None:
        raise _fail(
            "loop.steps_per_epoch",
            None,
            "strategy=parameter_server has no natural end of an epoch (each worker draws batches from its "
            "own endless dataset)",
            "pass a fixed number of steps per epoch, e.g. loop.steps_per_epoch=50",
        )
    return settings


def _component(group: str, node: Mapping[str, Any], own_keys: tuple[str, ...] = ("_target_",)) -> Component:
    """A `_target_` node: the callable's dotted path and the arguments the config gives it."""
    target = node.get("_target_")
    if not isinstance(target, str) or not target.strip() or "." not in target:
        raise _fail(
            f"{group}._target_",
            target,
            "it must be the dotted path of a callable (module.function)",
            f"pick one of the {group} group's options ({group}=<option>) or give your own, e.g. "
            f"{group}._target_=mylab.{group}s.build",
        )
    return Component(group, target, {key: value for key, value in node.items() if key not in own_keys})


def _dataset(node: Mapping[str, Any]) -> DatasetSettings:
    name = _text(
        "dataset.name",
        node.get("name"),
        fix="name the data, e.g. dataset.name=fashion_mnist (it names the MLflow dataset inputs)",
    )
    directory = node.get("dir")
    if directory is not None:
        if not isinstance(directory, str) or not directory:
            raise _fail(
                "dataset.dir",
                directory,
                "it must be a directory's path or null",
                "point dataset.dir at the directory holding the data (fashion_mnist: the four IDX files, "
                "or null to use tf.keras.datasets; image_folder: its train/ and test/ folders)",
            )
        directory = os.path.expanduser(directory)
        if not os.path.isdir(directory):
            raise _fail(
                "dataset.dir",
                directory,
                "no such directory",
                "point dataset.dir at the directory holding the data (fashion_mnist: the four IDX files "
                "train-images-idx3-ubyte.gz, ..., or null to use tf.keras.datasets; image_folder: its train/ "
                "and test/ folders)",
            )
    counts = {
        key: _int(
            f"dataset.{key}",
            node.get(key),
            minimum=1,
            nullable=True,
            fix=f"pass a positive number of examples, e.g. dataset.{key}=1000, or null for all",
        )
        for key in ("train_examples", "test_examples")
    }
    scale = _number(
        "dataset.scale",
        node.get("scale"),
        minimum=0.0,
        positive=True,
        fix="pass the number raw inputs are divided by, e.g. dataset.scale=255 for 8-bit pixels, or 1",
    )
    component = _component("dataset", {**node, **({"dir": directory} if directory is not None else {})}, DATASET_KEYS)
    return DatasetSettings(name=name, component=component, scale=scale, **counts)


def _model(node: Mapping[str, Any]) -> Component:
    if "weight_decay" in node:
        _number(
            "model.weight_decay",
            node.get("weight_decay"),
            minimum=0.0,
            fix="pass a non-negative L2 factor, e.g. model.weight_decay=1e-5",
        )
    return _component("model", node)


def _optimizer(node: Mapping[str, Any]) -> OptimizerSettings:
    lr = _number(
        "optimizer.lr",
        node.get("lr"),
        minimum=0.0,
        positive=True,
        fix="pass a positive learning rate, e.g. optimizer.lr=0.001",
    )
    return OptimizerSettings(_component("optimizer", node, ("_target_", "lr")), lr)


def _loop(node: Mapping[str, Any]) -> LoopSettings:
    style = _choice("loop", node.get("style"), LOOP_STYLES, "pick one of the loop group's options")
    steps_per_epoch = _int(
        "loop.steps_per_epoch",
        node.get("steps_per_epoch"),
        minimum=1,
        nullable=True,
        fix="pass a positive number of steps, or null for one pass over the training set",
    )
    steps_per_call = _int(
        "loop.steps_per_call",
        node.get("steps_per_call"),
        minimum=1,
        fix="pass a positive number of steps per tf.function call, e.g. loop.steps_per_call=20",
    )
    return LoopSettings(style, steps_per_epoch, steps_per_call)


def _runtime(node: Mapping[str, Any], strategy: str) -> RuntimeSettings:
    jit_compile = _bool(
        "runtime.jit_compile", node.get("jit_compile"), "pass runtime.jit_compile=true or runtime.jit_compile=false"
    )
    policy = _choice(
        "runtime.mixed_precision",
        node.get("mixed_precision"),
        MIXED_PRECISION_POLICIES,
        "use mixed_bfloat16 on CPUs with AMX/AVX512-BF16 and TPUs, mixed_float16 on GPUs, or null",
        nullable=True,
    )
    deterministic = _bool(
        "runtime.deterministic",
        node.get("deterministic"),
        "pass runtime.deterministic=true or runtime.deterministic=false",
    )
    if deterministic and strategy == "parameter_server":
        raise _fail(
            "runtime.deterministic",
            True,
            "strategy=parameter_server trains asynchronously: each worker applies its updates whenever it finishes "
            "a step, so the order of updates (and every number after the first step) depends on timing, and each "
            "worker shuffles with a seed of its own",
            "use strategy=multi_worker_mirrored (synchronous) for a reproducible multi-process run, or drop "
            "runtime.deterministic to train with parameter servers",
        )
    return RuntimeSettings(jit_compile, policy, deterministic)


def mlflow_settings(cfg: Mapping[str, Any]) -> MlflowSettings:
    """The config's mlflow section (also what a sweep checks before it creates its parent run)."""
    node = _section(cfg, "mlflow")
    store_fix = "pass a store such as sqlite:///mlflow.db or http://host:5000, or leave it null for MLflow's default"
    tracking_uri = _text("mlflow.tracking_uri", node.get("tracking_uri"), nullable=True, fix=store_fix)
    if tracking_uri is not None:  # first: the messages below would repeat the URI
        refuse_credentials_in_uri("mlflow.tracking_uri", tracking_uri)
    schemes = (*TRACKING_SCHEMES, *plugin_tracking_schemes())
    if tracking_uri is not None and tracking_uri.split(":")[0].split("+")[0] not in schemes:
        raise _fail(
            "mlflow.tracking_uri",
            tracking_uri,
            "MLflow 3 tracks into a database or a tracking server, named by a URI such as "
            f"sqlite:///path.db (schemes: {', '.join(schemes)}), and refuses a directory",
            store_fix,
        )
    registered_model_name = _text(
        "mlflow.registered_model_name",
        node.get("registered_model_name"),
        fix="name the registered model, e.g. mlflow.registered_model_name=fashion_mnist",
    )
    if any(char in registered_model_name for char in "/:"):  # they separate the parts of a models:/ URI
        raise _fail(
            "mlflow.registered_model_name",
            registered_model_name,
            "it must not contain '/' or ':'",
            "name the registered model without them, e.g. mlflow.registered_model_name=fashion_mnist",
        )
    register = _bool(
        "mlflow.register", node.get("register"), "pass mlflow.register=true to register this run's model, or false"
    )
    log_model = _bool(
        "mlflow.log_model",
        node.get("log_model"),
        "pass mlflow.log_model=true to log the trained model, or false to skip it",
    )
    if register and not log_model:
        raise RunnerError(
            "mlflow.register=true needs the run's model, but mlflow.log_model=false skips logging it. "
            "Fix: drop mlflow.log_model=false, or drop mlflow.register=true."
        )
    metrics = _section(node, "system_metrics", "mlflow.")
    return MlflowSettings(
        tracking_uri=tracking_uri,
        experiment_name=_text(
            "mlflow.experiment_name",
            node.get("experiment_name"),
            fix="name the MLflow experiment, e.g. mlflow.experiment_name=fashion_mnist",
        ),
        run_name=_text(
            "mlflow.run_name",
            node.get("run_name"),
            nullable=True,
            fix="name the run, e.g. mlflow.run_name=baseline, or leave it null for MLflow's random name",
        ),
        registered_model_name=registered_model_name,
        register=register,
        log_model=log_model,
        system_metrics=SystemMetricsSettings(
            enabled=_bool(
                "mlflow.system_metrics.enabled",
                metrics.get("enabled"),
                "pass mlflow.system_metrics.enabled=false to turn system metrics off, true to keep them",
            ),
            interval_seconds=_number(
                "mlflow.system_metrics.interval_seconds",
                metrics.get("interval_seconds"),
                minimum=MIN_SAMPLING_SECONDS,
                fix="pass the seconds between two samples of CPU and memory, e.g. "
                "mlflow.system_metrics.interval_seconds=10",
            ),
        ),
        checkpoints=_choice(
            "mlflow.checkpoints",
            node.get("checkpoints"),
            CHECKPOINT_UPLOADS,
            "pass mlflow.checkpoints=last to keep the run's newest checkpoint in MLflow, all to keep "
            "every save, or none to keep checkpoints only in the run directory",
        ),
        outage_seconds=_number(
            "mlflow.outage_seconds",
            node.get("outage_seconds"),
            minimum=0,
            fix="pass how many seconds a run may wait at its end for a tracking server that "
            "stopped answering, e.g. mlflow.outage_seconds=3600 (0: do not wait)",
        ),
    )


def plugin_tracking_schemes() -> tuple[str, ...]:
    """The URI schemes of the tracking stores that installed MLflow plugins register (entry point group
    `mlflow.tracking_store`), which MLflow tracks into as it does its own."""
    from importlib.metadata import entry_points

    return tuple(entry.name for entry in entry_points(group="mlflow.tracking_store"))


def refuse_credentials_in_uri(key: str, uri: str) -> None:
    """A tracking URI with a password in it (user:password@) would put the password in params, logs and error
    messages: refused, with where the password goes instead."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return
    redacted = parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()
    where = (
        "the environment variables MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (docs/team-server.md)"
        if parts.scheme in ("http", "https")
        else "the database client's own password file or variable (PostgreSQL: ~/.pgpass or PGPASSWORD)"
    )
    raise RunnerError(
        f"{key}={redacted!r} is not valid: it embeds a password (user:password@), which would be recorded with "
        f"the run's params and logs. Fix: give the address without it and the credentials in {where}."
    )


def sweep_seeds(cfg: Mapping[str, Any]) -> int:
    """`sweep.seeds`, validated: how many seeds every point of a sweep is trained with."""
    node = _section(cfg, "sweep")
    return _int(
        "sweep.seeds",
        node.get("seeds"),
        minimum=1,
        fix="pass how many seeds each point of a sweep trains with, e.g. sweep.seeds=3 (1 for one run)",
    )


def target_components(cfg: Mapping[str, Any], groups: tuple[str, ...] = TARGET_GROUPS) -> list[Component]:
    """The `_target_` callables of a composed config with the arguments it gives them, without validating the
    rest (what a sweep checks before its parent run, where a swept key may still change other values)."""
    own = {"optimizer": ("_target_", "lr"), "dataset": DATASET_KEYS}
    return [_component(group, _section(cfg, group), own.get(group, ("_target_",))) for group in groups]


def from_config(cfg: Mapping[str, Any]) -> Settings:
    """Validate a composed config (a resolved DictConfig or plain mapping) into Settings."""
    strategy = _strategy(_section(cfg, "strategy"))
    model = _section(cfg, "model")
    optimizer = _section(cfg, "optimizer")
    lr_scaling = _section(cfg, "lr_scaling")
    checkpoint = _section(cfg, "checkpoint")
    loop = _section(cfg, "loop")
    return Settings(
        batch=_int(
            "batch",
            cfg.get("batch"),
            minimum=1,
            fix="pass the per-replica batch size as a positive integer, e.g. batch=64",
        ),
        epochs=_int("epochs", cfg.get("epochs"), minimum=1, fix="pass a positive number of epochs, e.g. epochs=2"),
        # NumPy's seed is 32 bits.
        seed=_int(
            "seed",
            cfg.get("seed"),
            minimum=0,
            maximum=2**32 - 1,
            fix="pass a non-negative integer seed below 2**32, e.g. seed=42",
        ),
        progress=_bool(
            "progress",
            cfg.get("progress"),
            "pass progress=true (always), progress=false (never) or progress=null (only when stderr is a terminal)",
            nullable=True,
        ),
        resume=_choice(
            "resume",
            cfg.get("resume"),
            RESUME_MODES,
            "use resume=auto to continue from a run directory's checkpoints, resume=never to refuse",
        ),
        strategy=strategy,
        dataset=_dataset(_section(cfg, "dataset")),
        model=_model(model),
        optimizer=_optimizer(optimizer),
        schedule=_component("schedule", _section(cfg, "schedule")),
        loss=_component("loss", _section(cfg, "loss")),
        lr_scaling=LrScalingSettings(
            rule=_choice("lr_scaling.rule", lr_scaling.get("rule"), LR_RULES, "use lr_scaling=none, linear or sqrt"),
            base_batch=_int(
                "lr_scaling.base_batch",
                lr_scaling.get("base_batch"),
                minimum=1,
                fix="pass the global batch the base learning rate was tuned for, e.g. 64",
            ),
            warmup_epochs=_number(
                "lr_scaling.warmup_epochs",
                lr_scaling.get("warmup_epochs"),
                minimum=0.0,
                fix="pass a number of epochs >= 0 (0 turns warm-up off)",
            ),
        ),
        loop=_loop(loop),
        checkpoint=CheckpointSettings(
            every_epochs=_int(
                "checkpoint.every_epochs",
                checkpoint.get("every_epochs"),
                minimum=1,
                fix="pass a positive number of epochs between checkpoints",
            ),
            max_to_keep=_int(
                "checkpoint.max_to_keep",
                checkpoint.get("max_to_keep"),
                minimum=1,
                fix="pass how many checkpoints to keep, e.g. 3",
            ),
        ),
        runtime=_runtime(_section(cfg, "runtime"), strategy.name),
        mlflow=mlflow_settings(cfg),
        verbose=_bool("verbose", cfg.get("verbose"), "pass verbose=true or verbose=false"),
        cluster=_cluster(_section(cfg, "cluster"), strategy.name, loop),
        sweep_seeds=sweep_seeds(cfg),
        init=init_settings(_section(cfg, "init")),
    )


def init_settings(node: Mapping[str, Any]) -> InitSettings:
    """The init section: init.from is null, runs:/<run id>/<path>, models:/<name>@<alias>, models:/<name>/<version>,
    or a run directory, its checkpoints/ directory or one checkpoint (a ckpt-N prefix) that exists."""
    for key in node:
        if key != "from":
            raise _fail(
                f"init.{key}",
                node[key],
                "the init group has one key, init.from",
                "give where the weights come from as init.from=<run dir, runs:/ or models:/ URI>",
            )
    value = node.get("from")
    fix = (
        "pass a run directory of an earlier run (or its checkpoints/ directory), runs:/<run id>/model, "
        "models:/<name>@<alias> (e.g. models:/fashion_mnist@champion) or models:/<name>/<version>; "
        "or init.from=null to start from the model's own initialisation"
    )
    source = _text("init.from", value, fix=fix, nullable=True)
    if source is None:
        return InitSettings(source=None, kind=None)
    if source.startswith("runs:"):
        if not re.fullmatch(r"runs:/[^/\s]+/\S+", source):
            raise _fail("init.from", source, "a run's model is named runs:/<run id>/<artifact path>", fix)
        return InitSettings(source, "runs")
    if source.startswith("models:"):
        if not re.fullmatch(r"models:/[^/@:\s]+(@[^/@\s]+|/\d+)", source):
            raise _fail(
                "init.from",
                source,
                "a registered model's version is named models:/<name>@<alias> or models:/<name>/<version number>",
                fix,
            )
        return InitSettings(source, "models")
    if re.match(r"[A-Za-z][\w+.-]*:/", source):
        raise _fail(
            "init.from",
            source,
            "the runner loads weights from runs:/ and models:/ URIs and from local checkpoint directories",
            fix,
        )
    path = os.path.abspath(os.path.expanduser(source))
    if os.path.isfile(path + ".index"):  # one checkpoint, named by its prefix (.../checkpoints/ckpt-96)
        return InitSettings(path, "checkpoint")
    if not os.path.isdir(path):
        raise _fail(
            "init.from",
            source,
            f"there is no directory {path} (nor a checkpoint of that name), and it is not a runs:/ or models:/ URI",
            fix,
        )
    for directory in (path, os.path.join(path, "checkpoints")):
        if os.path.isfile(os.path.join(directory, "checkpoint")) or glob.glob(os.path.join(directory, "ckpt-*.index")):
            return InitSettings(directory, "checkpoint")
    raise _fail(
        "init.from",
        source,
        f"{path} holds no checkpoint (no ckpt-*.index files in it or in its checkpoints/ directory)",
        fix,
    )

"""The config's schema: every key the runner reads, its type and its one default, as Hydra structured configs.

conf/config.yaml starts its defaults list with `runner_schema` (registered here in Hydra's ConfigStore); the
group options (conf/strategy/mirrored.yaml, ...) set only what differs. Being structured, the composed config
refuses a key the schema does not have, even with `+` (runner.config.check turns that into one paragraph).

The `_target_` groups (model, optimizer, schedule, loss, dataset) are open: their keys are the callable's
arguments, checked against its signature by runner.config.components; only the keys the runner applies itself are
typed (optimizer.lr; dataset's name, train_examples, test_examples and scale).

Types: a field is `Any` where runner.config.settings is stricter than OmegaConf's conversion, so that the value reaches
runner.config.settings as typed and is refused there with its paragraph:
- booleans: OmegaConf turns 1, "yes" and "on" into true, which the runner refuses (progress=1 is a mistake);
- floats: OmegaConf turns "0.5" (a quoted string) into 0.5, and 0 into 0.0, which would then be what the
  paragraph quotes and what MLflow logs as the param;
- strategy.tpu: OmegaConf turns 5 into "5"; strategy.devices: a list of names or null, no OmegaConf type.
Ints and strings are typed: what OmegaConf refuses there (batch=abc, epochs=1e9, a list or null for a name) the
runner refuses too, and runner.config.check reports it with runner.config.settings' paragraph. (A quoted integer,
batch='64', becomes the integer.)

A new key is a field here with its default (and its check in runner.config.settings, without a default of its own). A
key that is a Python keyword (`init.from`) cannot be a dataclass field: give its group as a `Dict[str, Any]`
field whose default holds the key (`field(default_factory=lambda: {"from": None})`); runner.config.check refuses
any other key under it as it does for a dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

SCHEMA_NAME = "runner_schema"
# The groups whose keys are a `_target_` callable's arguments: open to any key (runner.config.components checks them).
TARGET_GROUPS = ("dataset", "model", "optimizer", "schedule", "loss", "pruner")


@dataclass
class VariablePartitionerConfig:
    """parameter_server: split big variables into shards across the ps tasks (MinSizePartitioner)."""

    max_shards: int | None = None  # null = no splitting; N = at most N shards
    min_shard_bytes: int = 256 << 10  # no shard smaller than this (256 KiB)


@dataclass
class StrategyConfig:
    name: str = MISSING  # set by the strategy group's option
    devices: Any = None  # a list of device names, or null to auto-detect
    cross_device_ops: str | None = None  # nccl | hierarchical_copy | reduce_to_one | null (TensorFlow's choice)
    cpu_replicas: int | None = None  # split the CPU into N logical devices (mirrored, central_storage)
    tpu: Any = ""  # TPU name or grpc:// address; "" for a TPU VM's local TPU
    communication: str = "auto"  # multi_worker_mirrored's all-reduce: auto | ring (gRPC) | nccl (GPUs)
    variable_partitioner: VariablePartitionerConfig = field(default_factory=VariablePartitionerConfig)


@dataclass
class ClusterConfig:
    """Several processes forming one TensorFlow cluster (strategy=multi_worker_mirrored and parameter_server)."""

    kind: str = "none"  # none | local | tf_config | slurm: set by the cluster group's option
    workers: int = 2  # local: worker processes
    ps: int = 1  # local and slurm: parameter servers (strategy=parameter_server)
    # multi_worker_mirrored: null = TensorFlow's coordination service finds a dead or frozen peer by its missing
    # heartbeats; N = also give up on any one all-reduce after N seconds (each then holds a thread that long).
    timeout_seconds: Any = None
    port_base: int = 8888  # slurm: the first port of the tasks on each node


@dataclass
class LrScalingConfig:
    rule: str = MISSING  # none | linear | sqrt: set by the lr_scaling group's option
    base_batch: int = 64  # the global batch optimizer.lr was tuned for
    warmup_epochs: Any = 0  # linear warm-up over this many epochs; 0 = none


@dataclass
class LoopConfig:
    style: str = MISSING  # for_in | iterator | in_function | multi_step: set by the loop group's option
    steps_per_epoch: int | None = None  # null = one pass over the training set
    steps_per_call: int = 1  # multi_step: steps inside one tf.function call


@dataclass
class CheckpointConfig:
    every_epochs: int = 2
    max_to_keep: int = 3


@dataclass
class RuntimeConfig:
    jit_compile: Any = False  # XLA-compile the per-replica forward and backward pass
    mixed_precision: str | None = None  # null | mixed_float16 (with loss scaling) | mixed_bfloat16
    # true: TensorFlow's op determinism (deterministic kernels or an error, ordered input pipeline, every random
    # source from `seed`), so that the same command gives bit-identical metrics; refuses parameter_server.
    deterministic: Any = False


@dataclass
class SystemMetricsConfig:
    """CPU, memory (and GPU) of the training machine under system/, sampled by the process that tracks."""

    enabled: Any = True
    interval_seconds: Any = 10  # one point per interval; a run shorter than one interval gets none


@dataclass
class MlflowConfig:
    tracking_uri: str | None = None  # null = MLflow's default (MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)
    experiment_name: str = "fashion_mnist"
    run_name: str | None = None  # null = MLflow's random name
    # The Model Registry name a sweep registers its best job's model under (and a run's, with register=true);
    # its alias `champion` is on the version with the best sweep.objective. By default: the data's name.
    registered_model_name: str = "${dataset.name}"
    register: Any = False  # true: a single run registers its own model as a new version
    log_model: Any = True  # false: no MLflow Model at the end of a run (quick smoke runs); a sweep registers none
    system_metrics: SystemMetricsConfig = field(default_factory=SystemMetricsConfig)
    # Which checkpoints the run's MLflow artifacts hold (under checkpoints/): last = only the newest one (the one
    # eval_accuracy measures), uploaded when the run ends (FINISHED, KILLED or FAILED); all = every save, as it is
    # written; none = no checkpoint artifacts. Either way <run dir>/checkpoints/ keeps checkpoint.max_to_keep.
    checkpoints: str = "last"
    # Training never waits for the tracking server: what it logs is queued, journaled in the run directory and
    # delivered in order. A process that ends while the server is down waits until the server has been down this
    # long, then leaves the rest in <run dir>/mlflow_journal.jsonl for the next invocation (or the replay command).
    outage_seconds: Any = 3600


@dataclass
class SweepConfig:
    """Sweeps (python -m runner -m batch=32,64 ...)."""

    # What each job returns to the sweeper: train_loss | train_accuracy | test_loss | test_accuracy |
    # eval_accuracy | examples_per_second.
    objective: str = "test_accuracy"
    # Train every point with this many seeds (seed, seed+1, ...), one run each; a point's objective is their mean.
    seeds: int = 1


@dataclass
class DatasetConfig:
    """What is trained on: `_target_` is a callable returning the data (runner.data.source); the keys below are
    the runner's, applied to any dataset; any other key is an argument of the callable."""

    _target_: str = MISSING  # set by the dataset group's option
    name: str = MISSING  # names the data in MLflow (dataset inputs) and the registered model
    train_examples: int | None = None  # take this many training examples (null = all)
    test_examples: int | None = None
    scale: Any = 255  # inputs are divided by this (raw pixels 0-255 -> 0-1); the logged model does it too


@dataclass
class OptimizerConfig:
    """Called as build(learning_rate=..., **arguments); `lr` is the base rate, scaled by lr_scaling."""

    _target_: str = MISSING
    lr: Any = MISSING  # set by the optimizer's option: the rate it was tuned for at lr_scaling.base_batch


@dataclass
class RunnerConfig:
    batch: int = 64  # examples per replica in one step; the global batch is batch x replicas in sync
    epochs: int = 10
    seed: int = 42  # seeds Python, NumPy, TensorFlow and the shuffle
    # Per-epoch progress bar on stderr: null = only when stderr is a terminal (a run writing to a file or a pipe
    # gets no carriage-return redraws), true = always, false = never. The summary line per epoch is always logged.
    progress: Any = None
    # auto: a run directory that holds checkpoints resumes from the newest (and continues its MLflow run);
    # never: refuse a run directory that holds an earlier run's checkpoints or MLflow run.
    resume: str = "auto"
    # true: also TensorFlow's and MLflow's INFO lines; by default the terminal and the log file show the runner's
    # lines and the warnings and errors that matter.
    verbose: Any = False
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    # model, schedule and loss: a `_target_` callable and its arguments, all set by the group's option.
    # model: build(input_shape=..., num_classes=..., **arguments) in strategy.scope(), returning logits.
    # schedule: build(learning_rate=..., total_steps=..., **arguments): a rate or a Keras schedule.
    # loss: loss(labels, logits, **arguments): one loss per example (the runner averages over the global batch
    # and adds the model's regularization losses).
    model: dict[str, Any] = field(default_factory=dict)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: dict[str, Any] = field(default_factory=dict)
    loss: dict[str, Any] = field(default_factory=dict)
    lr_scaling: LrScalingConfig = field(default_factory=LrScalingConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    # Warm start (fine-tuning): the model's weights before step 1, for a fresh run (a run directory that holds
    # checkpoints resumes from its own instead). init.from: null = the model's own initialisation; a run directory,
    # its checkpoints/ directory or one ckpt-N checkpoint; runs:/<run id>/model; models:/<name>@<alias> or
    # models:/<name>/<version>. Only the model's weights: the optimizer and the epoch counter start afresh.
    # (`from` is a Python keyword, so the group is a mapping; runner.config.settings.init_settings refuses other keys.)
    init: dict[str, Any] = field(default_factory=lambda: {"from": None})
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    # An Optuna sweep's pruner (conf/pruner/): `_target_` (null = none) and its arguments, checked by
    # runner.sweeps.pruning against its signature before the sweep starts.
    pruner: dict[str, Any] = field(default_factory=lambda: {"_target_": None})


def schema_node():
    """The schema as a DictConfig whose `_target_` groups accept any key (Hydra's struct mode stops at them)."""
    node = OmegaConf.structured(RunnerConfig)
    for group in TARGET_GROUPS:
        OmegaConf.set_struct(node[group], False)
    return node


def register() -> None:
    """Put the schema in Hydra's ConfigStore (idempotent): before anything composes conf/config.yaml."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=schema_node())


register()

"""Every key the runner reads, declared once: its type (`... | None` where it may be null), default, check and
the fix its refusal paragraph gives.

The declarations are the settings themselves: frozen dataclasses whose fields carry a `key(...)`. `read` checks a
config node against them into the `Settings` tree the rest of the program reads (runner.config.settings.validate
adds the rules across keys); `structured_schema()` turns them into the structured config Hydra composes
conf/config.yaml over (`runner_schema`), which refuses a key it does not declare. The `_target_` groups are open:
their other keys are the callable's arguments, checked against its signature (runner.config.components). A new
key is one field here; a rule across keys is one row of runner.config.settings.RULES.
"""

from __future__ import annotations

import dataclasses
import functools
import keyword
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from runner.config.checks import (
    ADDRESS,
    BOOL,
    CONSTRAINT_LINES,
    DEVICES,
    FRACTION,
    METRIC_KEY,
    METRIC_KEYS,
    MODEL_NAME,
    TEXT,
    TRACKING_URI,
    UNCHECKED,
    Among,
    Check,
    Choice,
    Int,
    Number,
    one_or_list,
    refusal,
)
from runner.config.components import Component, import_target
from runner.errors import RunnerError
from runner.metric_table import DIRECTIONS, Metric, MetricTable
from runner.strategy_kinds import STRATEGIES
from runner.task_kinds import KINDS

SCHEMA_NAME = "runner_schema"
Kind = TypeVar("Kind")
# sweep.trial_models: every run of a sweep logs its model, or only the sweep's champion (runner.sweeps.job.champion).
TRIAL_MODELS = ("every", "champion")


def key(default: Any, check: Check, fix: str, *, shown_as: str | None = None, name: str | None = None) -> Any:
    """One key's declaration: its default (MISSING: set by the group's option), its check, the fix its refusal
    gives, the name the paragraph shows if not its path (loop.style is shown as `loop`), and its name in the
    config if not the field's (`from` is a Python keyword)."""
    return field(default=default, metadata={"check": check, "fix": fix, "shown_as": shown_as, "name": name})


def group(kind: type) -> Any:
    """A nested group of keys."""
    return field(default_factory=kind, metadata={"group": True})


def metric_group() -> Any:
    """The `metrics` mapping: the model's scores by name, each a Keras metric's `_target_` and its arguments
    (runner.config.schema.MetricSettings)."""
    return field(default=DEFAULT_METRICS, metadata={"metrics": True})


def open_group(optional: bool = False, supplies: tuple[str, ...] = (), positional: int = 0) -> Any:
    """A `_target_` group: the callable and its arguments; the runner's own keys are its class's other fields.
    `optional`: a null `_target_` means none (the group's default); `supplies`: the keyword arguments the runner
    passes the callable itself, `positional`: how many positional ones (the config gives the rest)."""
    facts = {"target": True, "supplies": supplies, "positional": positional}
    if optional:
        return field(default=None, metadata={**facts, "optional": True})
    return field(default_factory=lambda: Component("", ""), metadata=facts)


@dataclass(frozen=True)
class MetricSettings:
    """One of the model's scores (`metrics.<name>`): a Keras metric, `_target_` and its arguments, made in
    strategy.scope() and updated inside the replica step with (labels, the model's outputs); logged as
    train_<name>, val_<name>, test_<name> and eval_<name>. `direction` (min or max) where the runner's metric
    table (runner.metric_table) cannot tell lower or higher better from its name or its class."""

    name: str
    component: Component
    direction: str | None = None


# The tutorial's score: the share of examples whose largest logit is their label.
DEFAULT_METRICS = (
    MetricSettings("accuracy", Component("metrics.accuracy", "tf_keras.metrics.SparseCategoricalAccuracy", {})),
)
METRIC_NAME = re.compile(r"[a-z][a-z0-9_]*")
_DIRECTION_WORDS = {"min": "minimize", "max": "maximize", "minimize": "minimize", "maximize": "maximize"}
_METRIC_EXAMPLE = (
    "e.g. +metrics.top5._target_=tf_keras.metrics.SparseTopKCategoricalAccuracy +metrics.top5.k=5, or ~metrics.top5 "
    "to drop one"
)


def table_of(metrics: tuple[MetricSettings, ...]) -> MetricTable:
    """The metric table (runner.metric_table) of a run with these scores: a score whose direction cannot be known
    is refused."""
    return MetricTable.of(_scored(each) for each in metrics)


def _scored(metric: MetricSettings) -> Metric:
    try:
        return Metric.of(metric.name, metric.direction, metric.component.target)
    except RunnerError:
        # A class that does not exist (a typo) has no direction either: say what is wrong with it first.
        import_target(f"{metric.component.group}._target_", metric.component.target)
        raise


def read_metrics(node: Any) -> tuple[MetricSettings, ...]:
    """The `metrics` mapping as MetricSettings, each name, `_target_` and direction checked (its arguments are
    checked against the callable by runner.config.settings.checked_targets)."""
    if not isinstance(node, Mapping):
        raise refusal("metrics", node, "it maps each score's name to its Keras metric", _METRIC_EXAMPLE)
    found = []
    for name, entry in node.items():
        key_name = f"metrics.{name}"
        if not isinstance(name, str) or not METRIC_NAME.fullmatch(name) or name == "loss":
            raise refusal(
                key_name,
                dict(entry) if isinstance(entry, Mapping) else entry,
                "a score's name is lowercase letters, digits and _ (it becomes train_<name>, val_<name>, ...), and "
                "not loss, the run's own",
                f"rename it, {_METRIC_EXAMPLE}",
            )
        if not isinstance(entry, Mapping):
            raise refusal(key_name, entry, "it must name a Keras metric by its _target_", _METRIC_EXAMPLE)
        path = entry.get("_target_")
        if not isinstance(path, str) or not path.strip() or "." not in path:
            raise refusal(
                f"{key_name}._target_",
                path,
                "it must be the dotted path of a Keras metric class (module.Class)",
                _METRIC_EXAMPLE,
            )
        direction = entry.get("direction")
        if direction is not None and direction not in _DIRECTION_WORDS:
            raise refusal(
                f"{key_name}.direction",
                direction,
                "it must be min (lower is better) or max",
                f"pass {key_name}.direction=max for a score, min for an error",
            )
        arguments = {key: value for key, value in entry.items() if key not in ("_target_", "direction")}
        chosen = None if direction is None else _DIRECTION_WORDS[direction]
        found.append(MetricSettings(name, Component(key_name, path, arguments), chosen))
    return tuple(found)


@dataclass(frozen=True)
class PartitionerSettings:
    """parameter_server: split big variables into shards across the ps tasks (MinSizePartitioner)."""

    max_shards: int | None = key(
        None, Int(), "pass the most shards a variable may be split into (e.g. the number of ps tasks), or null for none"
    )
    min_shard_bytes: int = key(  # no shard smaller than this (256 KiB)
        256 << 10,
        Int(),
        "pass the smallest shard size in bytes, e.g. strategy.variable_partitioner.min_shard_bytes=262144",
    )


@dataclass(frozen=True)
class StrategySettings:
    name: str = key(MISSING, Choice(*STRATEGIES), "pick one of the strategy group's options", shown_as="strategy")
    devices: tuple[str, ...] | None = key(  # null: auto-detect
        None, DEVICES, "pass e.g. 'strategy.devices=[/cpu:0]' or strategy.devices=null to auto-detect"
    )
    cross_device_ops: str | None = key(
        None,
        Choice("nccl", "hierarchical_copy", "reduce_to_one"),
        "use one of the listed all-reduce implementations or null for TensorFlow's choice",
    )
    cpu_replicas: int | None = key(  # split the CPU into N logical devices (mirrored, central_storage)
        None, Int(), "pass a positive number of logical CPU devices, e.g. strategy.cpu_replicas=2"
    )
    tpu: str = key("", ADDRESS, "pass strategy.tpu=my-tpu or ''")  # "": a TPU VM's local TPU
    communication: str = key(  # multi_worker_mirrored's all-reduce
        "auto", Choice("auto", "ring", "nccl"), "use auto (TensorFlow's choice), ring (gRPC, any device) or nccl (GPUs)"
    )
    variable_partitioner: PartitionerSettings = group(PartitionerSettings)


@dataclass(frozen=True)
class ClusterSettings:
    """Several processes forming one TensorFlow cluster (strategy=multi_worker_mirrored and parameter_server)."""

    kind: str = key(
        "none",
        Choice("none", "tf_config", "slurm", "local"),
        "pick one of the cluster group's options: cluster=local starts a cluster on this machine, "
        "cluster=tf_config or cluster=slurm join one started by Kubernetes, by hand or by srun",
    )
    workers: int = key(2, Int(), "pass the number of worker processes, e.g. cluster.workers=2")
    ps: int = key(1, Int(), "pass the number of parameter server processes, e.g. cluster.ps=1")
    # null: TensorFlow's coordination service finds a dead or frozen peer by its missing heartbeats; N: also give
    # up on any one all-reduce after N seconds (each then holds a thread that long).
    timeout_seconds: float | None = key(
        None,
        Number(minimum=1),
        "pass how long one all-reduce may wait for a peer, e.g. cluster.timeout_seconds=600, or null",
    )
    port_base: int = key(  # slurm: the first port of the tasks on each node
        8888, Int(maximum=65535), "pass a free TCP port for the first task on each node, e.g. cluster.port_base=8888"
    )


@dataclass(frozen=True)
class TaskSettings:
    """What the model predicts (runner.task_kinds): how labels are read and checked, what the model outputs and
    what its logged model serves. A task's option (conf/task/) also sets the loss and the metrics."""

    kind: str = key(
        "classification",
        Among(KINDS),
        "pick one of the task group's options: task=classification, regression, binary or multilabel",
    )
    # The score a sweep chooses on when sweep.objective is null: val_<objective> (test_<objective> without a
    # validation split), a name of the `metrics` mapping.
    objective: str = key(
        "accuracy", TEXT, "name one of the run's metrics, e.g. task.objective=accuracy (a sweep chooses on val_<it>)"
    )


# The validation split a sweep's job holds out when dataset.validation_fraction is null and it chooses on a val_
# objective (runner.sweeps.job.job.validation_of_job).
SWEEP_VALIDATION_FRACTION = 0.1


@dataclass(frozen=True)
class DatasetSettings:
    """What is trained on: `component` is the callable returning the data (runner.data.source) and its
    arguments; the keys below are the runner's, applied to any dataset."""

    name: str = key(  # names the data in MLflow (dataset inputs) and the registered model
        MISSING, TEXT, "name the data, e.g. dataset.name=fashion_mnist (it names the MLflow dataset inputs)"
    )
    train_examples: int | None = key(  # take this many training examples (null: all)
        None, Int(), "pass a positive number of examples, e.g. dataset.train_examples=1000, or null for all"
    )
    test_examples: int | None = key(
        None, Int(), "pass a positive number of examples, e.g. dataset.test_examples=1000, or null for all"
    )
    scale: float = key(  # inputs are divided by this (raw pixels 0-255 -> 0-1); the logged model does it too
        255,
        Number(positive=True),
        "pass the number raw inputs are divided by, e.g. dataset.scale=255 for 8-bit pixels, or 1",
    )
    # Hold out this fraction of the training examples (whole files, for file data) as a validation split,
    # stratified by label, evaluated every epoch (val_loss, val_accuracy). null: none (a sweep job's default:
    # SWEEP_VALIDATION_FRACTION).
    validation_fraction: float | None = key(
        None,
        FRACTION,
        "pass a fraction of the training examples to hold out, e.g. dataset.validation_fraction=0.1, or null for none",
    )
    # The seed the validation split is drawn from (null: the run's seed). A sweep sets it to the sweep's seed, so
    # every configuration and seed replicate is validated on the same examples.
    split_seed: int | None = key(
        None, Int(minimum=0), "pass a seed >= 0 for the validation split, e.g. dataset.split_seed=42"
    )
    # k-fold cross-validation (set by a sweep with sweep.folds): fold `fold` of `folds` of the training examples
    # (whole files, for file data), stratified and drawn from the split seed, is the validation split.
    folds: int | None = key(
        None, Int(minimum=2), "pass a number of folds >= 2, or null (a sweep sets it from sweep.folds)"
    )
    fold: int = key(0, Int(minimum=0), "pass the fold held out, from 0 to dataset.folds - 1")
    component: Component = open_group()


@dataclass(frozen=True)
class OptimizerSettings:
    """Called as build(learning_rate=..., **arguments); `lr` is the base rate, scaled by lr_scaling."""

    lr: float = key(MISSING, Number(positive=True), "pass a positive learning rate, e.g. optimizer.lr=0.001")
    component: Component = open_group(supplies=("learning_rate",))


@dataclass(frozen=True)
class LrScalingSettings:
    rule: str = key(MISSING, Choice("none", "linear", "sqrt"), "use lr_scaling=none, linear or sqrt")
    # The global batch optimizer.lr was tuned for.
    base_batch: int = key(64, Int(), "pass the global batch the base learning rate was tuned for, e.g. 64")
    # Linear warm-up over this many epochs; 0: none.
    warmup_epochs: float = key(0, Number(), "pass a number of epochs >= 0 (0 turns warm-up off)")


@dataclass(frozen=True)
class LoopSettings:
    style: str = key(
        MISSING,
        Choice("for_in", "iterator", "in_function", "multi_step"),
        "pick one of the loop group's options",
        shown_as="loop",
    )
    steps_per_epoch: int | None = key(
        None, Int(), "pass a positive number of steps, or null for one pass over the training set"
    )
    steps_per_call: int = key(  # multi_step: steps inside one tf.function call
        1, Int(), "pass a positive number of steps per tf.function call, e.g. loop.steps_per_call=20"
    )


@dataclass(frozen=True)
class CheckpointSettings:
    every_epochs: int = key(2, Int(), "pass a positive number of epochs between checkpoints")
    max_to_keep: int = key(3, Int(), "pass how many checkpoints to keep, e.g. 3")
    # Keep the weights of the epoch best by early_stopping.monitor: the evaluation at the end and the logged model
    # are that epoch's, not the last one's. null: true with early stopping (early_stopping.patience), else false.
    keep_best: bool | None = key(None, BOOL, "pass checkpoint.keep_best=true, false, or null (with early stopping)")


@dataclass(frozen=True)
class EarlyStoppingSettings:
    """Stop a run once the metric it watches has not improved for `patience` epochs, as Keras' EarlyStopping does
    (runner.training.early_stopping); off unless patience is set."""

    # Epochs in a row without improvement after which training stops; null: off, every epoch trains.
    patience: int | None = key(
        None, Int(minimum=0), "pass a number of epochs, e.g. early_stopping.patience=3, or null to train every epoch"
    )
    # The per-epoch metric watched, lower better for losses; null: sweep.objective where it is one, else val_loss.
    monitor: str | None = key(
        None,
        METRIC_KEY,
        "pass e.g. early_stopping.monitor=val_loss, or null for sweep.objective (else val_loss)",
    )
    # The least change that counts as an improvement.
    min_delta: float = key(0.0, Number(), "pass a non-negative change, e.g. early_stopping.min_delta=0.001")
    # The first epoch whose metric counts (the epochs before it neither improve nor wait).
    start_epoch: int = key(1, Int(), "pass the first epoch to watch, e.g. early_stopping.start_epoch=3")


@dataclass(frozen=True)
class RuntimeSettings:
    # XLA-compile the per-replica forward and backward pass.
    jit_compile: bool = key(False, BOOL, "pass runtime.jit_compile=true or runtime.jit_compile=false")
    mixed_precision: str | None = key(
        None,
        Choice("mixed_float16", "mixed_bfloat16"),
        "use mixed_bfloat16 on CPUs with AMX/AVX512-BF16 and TPUs, mixed_float16 on GPUs, or null",
    )
    # true: TensorFlow's op determinism (deterministic kernels or an error, ordered input pipeline, every random
    # source from `seed`), so that the same command gives bit-identical metrics; refuses parameter_server.
    deterministic: bool = key(False, BOOL, "pass runtime.deterministic=true or runtime.deterministic=false")
    # The Keras of the built-in models (2: tf_keras, 3: Keras 3); a user's model is in the Keras it was built with.
    keras: int = key(
        2, Choice(2, 3, why="the options are 2 (tf_keras) and 3 (Keras 3)"), "use runtime.keras=2 or runtime.keras=3"
    )


@dataclass(frozen=True)
class CostSettings:
    """How the served model's speed is measured at the end of a run (runner.training.cost): on one batch of the test
    split's raw inputs, warmed up, the median of a few timed calls."""

    latency_batch: int = key(32, Int(), "pass the served model's batch for its latency, e.g. cost.latency_batch=32")
    latency_repeats: int = key(5, Int(), "pass how many timed calls to take the median of, e.g. cost.latency_repeats=5")


@dataclass(frozen=True)
class SystemMetricsSettings:
    """CPU, memory (and GPU) of the training machine under system/, sampled by the process that tracks."""

    enabled: bool = key(
        True, BOOL, "pass mlflow.system_metrics.enabled=false to turn system metrics off, true to keep them"
    )
    interval_seconds: float = key(  # one point per interval; shorter ones mostly measure the sampling
        10,
        Number(minimum=0.1),
        "pass the seconds between two samples of CPU and memory, e.g. mlflow.system_metrics.interval_seconds=10",
    )


@dataclass(frozen=True)
class MlflowSettings:
    tracking_uri: str | None = key(  # null: MLflow's default (MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)
        None,
        TRACKING_URI,
        "pass a store such as sqlite:///mlflow.db or http://host:5000, or leave it null for MLflow's default",
    )
    experiment_name: str = key(
        "fashion_mnist", TEXT, "name the MLflow experiment, e.g. mlflow.experiment_name=fashion_mnist"
    )
    run_name: str | None = key(
        None, TEXT, "name the run, e.g. mlflow.run_name=baseline, or leave it null for MLflow's random name"
    )
    # The Model Registry name a sweep registers its best job's model under (and a run's, with register=true);
    # its alias `champion` is on the version with the best sweep.objective. By default: the data's name.
    registered_model_name: str = key(
        "${dataset.name}", MODEL_NAME, "name the registered model, e.g. mlflow.registered_model_name=fashion_mnist"
    )
    # A single run registers its own model as a new version.
    register: bool = key(False, BOOL, "pass mlflow.register=true to register this run's model, or false")
    # false: no MLflow Model at the end of a run; a sweep registers none.
    log_model: bool = key(True, BOOL, "pass mlflow.log_model=true to log the trained model, or false to skip it")
    # true: each epoch's checkpoint is also logged as a LoggedModel `checkpoint-<epoch>` at that epoch's step, linked
    # to its metrics, so mlflow.search_logged_models ranks them; each export costs seconds of the run.
    log_every_checkpoint: bool = key(
        False, BOOL, "pass mlflow.log_every_checkpoint=true to log every checkpoint's model, or false (the default)"
    )
    system_metrics: SystemMetricsSettings = group(SystemMetricsSettings)
    # Which checkpoints the run's MLflow artifacts hold (under checkpoints/): last = only the newest one (the one
    # eval_accuracy measures), uploaded when the run ends (FINISHED, KILLED or FAILED); all = every save, as it is
    # written; none = no checkpoint artifacts. Either way <run dir>/checkpoints/ keeps checkpoint.max_to_keep.
    checkpoints: str = key(
        "last",
        Choice("last", "all", "none"),
        "pass mlflow.checkpoints=last to keep the run's newest checkpoint in MLflow, all to keep every save, or "
        "none to keep checkpoints only in the run directory",
    )
    # Training never waits for the tracking server: what it logs is queued, journaled in the run directory and
    # delivered in order. A process that ends while the server is down waits until the server has been down this
    # long, then leaves the rest in <run dir>/mlflow_journal.jsonl for the next invocation (or the replay command).
    outage_seconds: float = key(
        3600,
        Number(minimum=0),
        "pass how many seconds a run may wait at its end for a tracking server that stopped answering, e.g. "
        "mlflow.outage_seconds=3600 (0: do not wait)",
    )


@dataclass(frozen=True)
class SweepSettings:
    """Sweeps (python -m runner -m batch=32,64 ...)."""

    # What each job returns to the sweeper and the sweep chooses its best configuration by. null: the task's score,
    # val_<task.objective> (val_accuracy for classification), on a validation split the sweep's jobs hold out
    # (dataset.validation_fraction, 0.1 unless set); test_<task.objective> where the data cannot be split
    # (runner.sweeps.terms). A single run registers (mlflow.register) by it too.
    objective: str | tuple[str, ...] | None = key(
        None,
        METRIC_KEYS,
        "pass one of them, e.g. sweep.objective=val_loss, a list of them for a trade-off, e.g. "
        "sweep.objective=[val_accuracy,parameters], or null for the task's default (val_<task.objective>, "
        "val_accuracy for classification, on a validation split).",
    )
    # Whether the sweep minimizes or maximizes its objective (and a registered model's comparison), one per objective
    # where there are several; null: each objective's own (runner.metric_table: losses, errors and costs are
    # minimized, scores maximized).
    direction: str | tuple[str, ...] | None = key(
        None,
        one_or_list(Choice(*DIRECTIONS, why="an objective is either minimized or maximized")),
        "pass sweep.direction=minimize or maximize (a list of them, one per objective, for several), or null for "
        "the objective's own",
    )
    # With several objectives: the one that chooses among the configurations no other beats on every objective
    # (the Pareto front), and so the registered model and the champion. null: the first.
    choose: str | None = key(
        None, METRIC_KEY, "pass one of sweep.objective's metrics, e.g. sweep.choose=val_accuracy, or null for the first"
    )
    # What a configuration must hold to be chosen, each "<metric> <= <number>" or "<metric> >= <number>" on the mean
    # of its runs' final values (any number a finished run logs, e.g. "parameters <= 100000", "latency_ms <= 2"): an
    # infeasible configuration is shown as such, never chosen nor registered; an Optuna study samples away from it.
    constraints: tuple[str, ...] = key(
        (),
        CONSTRAINT_LINES,
        "pass a list of quoted constraints, e.g. \"sweep.constraints=['parameters <= 100000']\", or []",
    )
    # sweep.direction (or hydra.sweeper.direction) against the objective's own direction (maximizing an error,
    # minimizing an accuracy) is refused unless this says it is meant.
    direction_against_metric: bool = key(
        False,
        BOOL,
        "pass sweep.direction_against_metric=true where sweep.direction goes against the objective's own on purpose",
    )
    # k-fold cross-validation: train every point (and seed) K times, fold k of the training data held out as the
    # validation split, one run each; a point's objective is the mean over its folds and seeds. null: no folds.
    folds: int | None = key(
        None, Int(minimum=2), "pass a number of folds >= 2, e.g. sweep.folds=5, or null for one validation split"
    )
    # Train every point with this many seeds (seed, seed+1, ...), one run each; a point's objective is their mean.
    seeds: int = key(
        1, Int(), "pass how many seeds each point of a sweep trains with, e.g. sweep.seeds=3 (1 for one run)"
    )
    # Train a sweep's runs on the basic, joblib and Ray launchers in warm worker processes that have imported
    # TensorFlow, MLflow and the runner once and train run after run (runner.sweeps.launch.warm_pool); false: every
    # run in a fresh `python -m runner` process. Cluster strategies and submitit's launchers always start their own.
    warm_workers: bool = key(True, BOOL, "pass sweep.warm_workers=true (warm workers) or false (a process per run)")
    # A warm worker whose resident memory exceeds this many MiB after a trial is replaced by a fresh one.
    worker_memory_mb: int = key(
        6144, Int(), "pass the MiB past which a warm worker is replaced, e.g. sweep.worker_memory_mb=6144"
    )
    # Which runs of a sweep log their trained model (with mlflow.log_model): every one as it finishes, or only the
    # sweep's champion, exported from its kept checkpoint when the sweep ends and then registered
    # (runner.sweeps.job.champion): each other trial skips the export (seconds of a small trial). Jobs on the sweep's
    # machine only (the basic and joblib launchers): the champion is exported where its checkpoint is.
    trial_models: str = key(
        "every",
        Choice(*TRIAL_MODELS, why="a sweep logs every run's model or its champion's alone"),
        "pass sweep.trial_models=every (each run logs its model) or champion (only the sweep's best, at its end)",
    )

    @property
    def objectives(self) -> tuple[str | None, ...]:
        """sweep.objective as a tuple: one item (None: the task's default) or several."""
        return self.objective if isinstance(self.objective, tuple) else (self.objective,)

    @property
    def chosen(self) -> str | None:
        """The objective that chooses the best configuration: sweep.choose, else the first (None: the task's
        default)."""
        return self.choose if self.choose is not None else self.objectives[0]


# hydra.sweeper.enqueue: trials to run first, each one trial's values as overrides.
OVERRIDE_LINES = Check(
    'it must be a list of strings, each one trial\'s overrides, e.g. ["optimizer.lr=0.001 batch=64"]',
    lambda value: isinstance(value, Sequence) and not isinstance(value, str) and all(isinstance(v, str) for v in value),
    tuple,
)
# hydra.sweeper.params: the search space in Hydra's sweep syntax, by key.
SEARCH_SPACE = Check(
    "it must be a mapping of keys to choice(...), range(...), interval(...) or tag(log, interval(...))",
    lambda value: isinstance(value, Mapping),
    dict,
)
# hydra.sweeper.terminate: the study terminators (runner.sweeps.study.terminator).
TERMINATORS = ("regret",)
# hydra.sweeper.max_failure_rate: a share of the trials, 0 and 1 included.
RATE = Check(
    "it must be a number from 0 to 1 (the share of the trials that may fail)",
    lambda value: not isinstance(value, bool) and isinstance(value, int | float) and 0 <= value <= 1,
    float,
)


@dataclass(frozen=True)
class OptunaSweeperSettings:
    """hparams_search=optuna's sweeper (conf/hydra/sweeper/optuna.yaml): the `hydra.sweeper` node, checked with the
    sweep before its parent run exists (runner.config.settings.optuna_sweeper_settings)."""

    # minimize or maximize sweep.objective (a list: each of its objectives); null: sweep.direction, else the
    # objective's own (runner.config.objective).
    direction: str | tuple[str, ...] | None = key(
        None,
        one_or_list(Choice(*DIRECTIONS, why="a study maximizes or minimizes sweep.objective")),
        "pass hydra.sweeper.direction=maximize (scores) or minimize (losses, errors), a list of them (one per "
        "objective) for several, or null for the objective's own",
    )
    n_trials: int = key(10, Int(), "pass how many trials the study has in all, e.g. hydra.sweeper.n_trials=20")
    # Trials at once; null: as many as the launcher runs at once.
    n_jobs: int | None = key(
        None, Int(), "pass how many trials run at once, e.g. hydra.sweeper.n_jobs=2, or null for the launcher's"
    )
    # A database URL every job can reach, or a journal file; null: optuna_study.journal in the sweep directory.
    storage: str | None = key(
        None,
        TEXT,
        "pass a database URL (hydra.sweeper.storage=postgresql://user@host/optuna), a journal file path, or null "
        "for optuna_study.journal in the sweep directory",
    )
    # null: the runner's default name (hydra-optuna-sweeper's configs write null for Optuna's own).
    study_name: str | None = key(None, TEXT, "pass a name, e.g. hydra.sweeper.study_name=runner, or null")
    # The sampler's config node ({_target_: optuna.samplers.TPESampler, seed: 42}), instantiated by the sweeper.
    sampler: Any = key(None, UNCHECKED, "")
    enqueue: tuple[str, ...] = key(
        (), OVERRIDE_LINES, "pass e.g. hydra.sweeper.enqueue='[\"optimizer.lr=0.001 batch=64\"]', or [] for none"
    )
    params: dict[str, Any] | None = key(
        None, SEARCH_SPACE, "give each searched key, e.g. hydra.sweeper.params.batch='choice(32, 64)'"
    )
    terminate: str | None = key(
        None,
        Choice(*TERMINATORS, why="the study terminators are " + ", ".join(TERMINATORS)),
        "pass hydra.sweeper.terminate=regret, or null to run n_trials trials",
    )
    terminate_min_trials: int = key(
        5,
        Int(minimum=2),
        "pass how many trials complete before the study may stop, at least 2 (the bound needs two), e.g. "
        "hydra.sweeper.terminate_min_trials=5",
    )
    # As Hydra's Optuna sweeper: a function(config, trial) that suggests more parameters with the trial (conditional
    # ones: `if trial.params["optimizer"] == "sgd": trial.suggest_float("optimizer.momentum", 0.0, 0.99)`); each is
    # passed to the trial's job as an override of its name.
    custom_search_space: str | None = key(
        None,
        TEXT,
        "pass the dotted path of a function taking (config, trial), e.g. "
        "hydra.sweeper.custom_search_space=mylab.search.extend, or null",
    )
    # As Hydra's Optuna sweeper: once more than this share of the study's ended trials failed, it asks no new trial
    # (the sweep then ends naming the failed jobs). null: no limit, every trial runs (0: stop at the first failure).
    max_failure_rate: float | None = key(
        None, RATE, "pass a share of the trials, e.g. hydra.sweeper.max_failure_rate=0.25, or null for no limit"
    )


@dataclass(frozen=True)
class InitSettings:
    """Warm start (fine-tuning): the model's weights before step 1, for a fresh run. init.from: null = the model's
    own initialisation; a run directory, its checkpoints/ directory or one ckpt-N checkpoint; runs:/<run id>/model;
    models:/<name>@<alias> or models:/<name>/<version>; a LoggedModel's id (m-<hex>, or models:/m-<hex>). Only the
    weights: the optimizer and epochs start afresh."""

    source: str | None = key(None, UNCHECKED, "", name="from")  # init.from, checked by runner.config.settings
    # checkpoint (an absolute path) | runs | models | logged_model (source: the id); set by the validator
    kind: str | None = None


@dataclass(frozen=True)
class Settings:
    # Examples per replica in one step; the global batch is batch x replicas in sync.
    batch: int = key(64, Int(), "pass the per-replica batch size as a positive integer, e.g. batch=64")
    epochs: int = key(10, Int(), "pass a positive number of epochs, e.g. epochs=2")
    # Seeds Python, NumPy, TensorFlow and the shuffle; NumPy's seed is 32 bits.
    seed: int = key(42, Int(minimum=0, maximum=2**32 - 1), "pass a non-negative integer seed below 2**32, e.g. seed=42")
    # The per-epoch progress bar on stderr: null = only when stderr is a terminal, true = always, false = never.
    progress: bool | None = key(
        None,
        BOOL,
        "pass progress=true (always), progress=false (never) or progress=null (only when stderr is a terminal)",
    )
    # auto: a run directory that holds checkpoints resumes from the newest (and continues its MLflow run);
    # never: refuse a run directory that holds an earlier run's checkpoints or MLflow run.
    resume: str = key(
        "auto",
        Choice("auto", "never"),
        "use resume=auto to continue from a run directory's checkpoints, resume=never to refuse",
    )
    # true: also TensorFlow's and MLflow's INFO lines on the terminal and in the log file.
    verbose: bool = key(False, BOOL, "pass verbose=true or verbose=false")
    strategy: StrategySettings = group(StrategySettings)
    cluster: ClusterSettings = group(ClusterSettings)
    task: TaskSettings = group(TaskSettings)
    dataset: DatasetSettings = group(DatasetSettings)
    # model: build(input_shape=..., num_classes=..., **arguments) in strategy.scope(), returning logits.
    model: Component = open_group(supplies=("input_shape", "num_classes"))
    optimizer: OptimizerSettings = group(OptimizerSettings)
    # schedule: build(learning_rate=..., total_steps=..., **arguments): a rate or a Keras schedule.
    schedule: Component = open_group(supplies=("learning_rate", "total_steps"))
    # loss: loss(labels, logits, **arguments): one loss per example (averaged over the global batch).
    loss: Component = open_group(positional=2)  # labels, logits
    # metrics: the model's scores besides its loss, by name: metrics.<name>._target_ a Keras metric class and its
    # arguments (metrics.<name>.direction: min or max where the runner's metric table cannot tell).
    metrics: tuple[MetricSettings, ...] = metric_group()
    # pruner: an Optuna pruner (runner.sweeps.study.pruning) stopping a sweep's hopeless trials; null: none.
    pruner: Component | None = open_group(optional=True)
    lr_scaling: LrScalingSettings = group(LrScalingSettings)
    loop: LoopSettings = group(LoopSettings)
    checkpoint: CheckpointSettings = group(CheckpointSettings)
    early_stopping: EarlyStoppingSettings = group(EarlyStoppingSettings)
    runtime: RuntimeSettings = group(RuntimeSettings)
    cost: CostSettings = group(CostSettings)
    init: InitSettings = group(InitSettings)
    mlflow: MlflowSettings = group(MlflowSettings)
    sweep: SweepSettings = group(SweepSettings)
    # The composed config, resolved: what a run logs as its params and config.yaml. Set by the validator.
    composed: Mapping[str, Any] = field(default_factory=dict)

    @property
    def metric_table(self) -> MetricTable:
        """Every key the run logs from its loss and scores, and each one's direction (runner.metric_table)."""
        return table_of(self.metrics)


def fix_of(kind: type, name: str) -> str:
    """The fix a key's refusal gives, from its declaration (`name`: the field's)."""
    return str(next(item.metadata["fix"] for item in declared(kind) if item.name == name))


def declared(kind: type) -> list[dataclasses.Field]:
    """The fields of a settings class that are keys or groups of the config."""
    return [item for item in dataclasses.fields(kind) if item.metadata]


def config_name(item: dataclasses.Field) -> str:
    return item.metadata.get("name") or item.name


@functools.cache
def _types(kind: type) -> dict[str, Any]:
    """A settings class's field types (annotations postponed by `from __future__ import annotations`)."""
    return typing.get_type_hints(kind)


def group_class(kind: type, item: dataclasses.Field) -> type:
    return _types(kind)[item.name]


def _target_fields(kind: type) -> list[tuple[str, str, dataclasses.Field]]:
    """(group, the dotted path of its Component in Settings, its `_target_` field) for each `_target_` group: an open
    group (model, schedule, loss, pruner), or a group of the runner's keys around one (dataset, optimizer: their
    `component`)."""
    found = []
    for item in declared(kind):
        if "target" in item.metadata:
            found.append((config_name(item), item.name, item))
        elif item.metadata.get("group"):
            inner = [each for each in declared(group_class(kind, item)) if "target" in each.metadata]
            found.extend((config_name(item), f"{item.name}.{each.name}", each) for each in inner)
    return found


# Each `_target_` group, from the declarations above: {group: (the keyword arguments the runner supplies, how many
# positional ones)}. Its keys besides the runner's are the callable's arguments, so the group is open to any key.
TARGET_ARGUMENTS = {
    name: (item.metadata["supplies"], item.metadata["positional"]) for name, _, item in _target_fields(Settings)
}
# Where each group's Component is in Settings; a run checks those it always builds (an optional one, the pruner,
# is checked by the sweep that uses it: runner.sweeps.study.pruning.check_sweep).
REQUIRED_TARGET_PATHS = tuple(path for _, path, item in _target_fields(Settings) if not item.metadata.get("optional"))
TARGET_GROUPS = tuple(TARGET_ARGUMENTS)
# The groups open to any key: the `_target_` groups (a callable's arguments), and `metrics` (any score's name).
OPEN_GROUPS = (*TARGET_GROUPS, "metrics")


def nullable(kind: type, item: dataclasses.Field) -> bool:
    """Whether a key may be null: its type is `... | None`."""
    return type(None) in typing.get_args(_types(kind)[item.name])


def read(kind: type[Kind], node: Mapping[str, Any], prefix: str = "") -> Kind:
    """The settings class `kind` from its config node, each key checked by its declaration."""
    values: dict[str, Any] = {}
    for item in declared(kind):
        name = config_name(item)
        if "group" in item.metadata:
            values[item.name] = read(group_class(kind, item), section(node, name, prefix), f"{prefix}{name}.")
        elif "metrics" in item.metadata:
            values[item.name] = read_metrics(node.get(name))
        elif "target" in item.metadata:  # dataset, optimizer: the group's own node is the callable's
            values[item.name] = target(prefix.rstrip(".") or name, node if prefix else section(node, name))
        else:
            check, shown = item.metadata["check"], item.metadata["shown_as"] or prefix + name
            values[item.name] = check(shown, node.get(name), item.metadata["fix"], nullable(kind, item))
    return kind(**values)


def section(config: Mapping[str, Any], key: str, parent: str = "") -> Mapping[str, Any]:
    """A group of settings (strategy, checkpoint, ...): an override that replaced it by a value is refused."""
    node = config.get(key)
    if not isinstance(node, Mapping):
        name = parent + key
        raise refusal(
            name,
            node,
            "it is a group of settings, not a value",
            f"set the group's keys one at a time (e.g. {name}.<key>=<value>)"
            + ("" if parent else f", or pick one of its options with {key}=<option> where conf/{key}/ has options"),
        )
    return node


def target(group: str, node: Mapping[str, Any]) -> Component | None:
    """A `_target_` group's callable and the arguments the config gives it: its keys but the runner's own
    (dataset.name, optimizer.lr). None: an optional group's null `_target_` (pruner)."""
    item, own = next(item for item in declared(Settings) if item.name == group), ["_target_"]
    if "group" in item.metadata:  # dataset, optimizer
        own += [config_name(each) for each in declared(group_class(Settings, item)) if "check" in each.metadata]
    path = node.get("_target_")
    if path is None and item.metadata.get("optional"):
        return None
    if not isinstance(path, str) or not path.strip() or "." not in path:
        raise refusal(
            f"{group}._target_",
            path,
            "it must be the dotted path of a callable (module.function)",
            f"pick one of the {group} group's options ({group}=<option>) or give your own, e.g. "
            f"{group}._target_=mylab.{group}s.build",
        )
    return Component(group, path, {key: value for key, value in node.items() if key not in own})


def _config_class(kind: type) -> type:
    """The structured-config dataclass Hydra composes over: each key typed as its check says OmegaConf holds it."""
    fields: list[tuple[str, Any, Any]] = []
    for item in declared(kind):
        name = config_name(item)
        if "check" in item.metadata:
            holds = item.metadata["check"].holds
            fields.append((name, holds | None if nullable(kind, item) else holds, field(default=item.default)))
        elif "target" in item.metadata and kind is not Settings:  # dataset, optimizer: the callable first
            fields.insert(0, ("_target_", str, field(default=MISSING)))
        elif "metrics" in item.metadata:  # a score's name and its Keras metric, any number: the task's option sets them
            fields.append((name, dict[str, Any], field(default_factory=dict)))
        elif "target" in item.metadata:  # model, schedule, loss: the callable and its arguments; pruner: none
            default = {"_target_": None} if item.metadata.get("optional") else {}
            fields.append((name, dict[str, Any], field(default_factory=functools.partial(dict, default))))
        elif any(keyword.iskeyword(config_name(each)) for each in declared(group_class(kind, item))):
            defaults = {config_name(each): each.default for each in declared(group_class(kind, item))}  # init.from
            fields.append((name, dict[str, Any], field(default_factory=functools.partial(dict, defaults))))
        else:
            nested = _config_class(group_class(kind, item))
            fields.append((name, nested, field(default_factory=nested)))
    return dataclasses.make_dataclass(kind.__name__.replace("Settings", "Config"), fields)


def structured_schema() -> DictConfig:
    """The schema as the DictConfig Hydra composes over, its `_target_` groups open to any key."""
    node = OmegaConf.structured(_config_class(Settings))
    for name in OPEN_GROUPS:
        OmegaConf.set_struct(node[name], False)
    return node


def register() -> None:
    """Put the schema in Hydra's ConfigStore (idempotent); runner/__main__.py calls it before Hydra composes."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=structured_schema())

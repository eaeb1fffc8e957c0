"""A composed config validated into the one typed `Settings` the program reads: `validate(config)`.

Each key is checked by its declaration in runner.config.schema; the rules here are the ones across keys. This
module imports no TensorFlow, so a mistyped value is refused in a fraction of a second, before any MLflow run
exists. Every refusal is a RunnerError naming the value and the fix, with the key as `RunnerError.key`.
"""

from __future__ import annotations

import dataclasses
import glob
import operator
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from runner.compat.keras3 import KERAS3_STRATEGIES, KERAS3_UNSUPPORTED
from runner.config import schema
from runner.config.checks import TEXT, Choice, Number, refusal
from runner.config.components import Component, check_targets
from runner.config.objective import Objective, Objectives
from runner.config.plain import as_plain
from runner.config.schema import (
    REQUIRED_TARGET_PATHS,
    TARGET_ARGUMENTS,
    TARGET_GROUPS,
    InitSettings,
    MlflowSettings,
    Settings,
    SweepSettings,
    TaskSettings,
)
from runner.errors import RunnerError
from runner.metric_table import MODEL_BYTES, MetricTable, snake_case
from runner.strategy_kinds import strategy_kind
from runner.task_kinds import KINDS

__all__ = [
    "Settings",
    "MlflowSettings",
    "SweepSettings",
    "InitSettings",
    "validate",
    "checked_targets",
    "checked_metric_targets",
]


class Rule(NamedTuple):
    """A rule across keys: `key` (its value at `path`, if not the same) is refused when `breaks`; `why` and `fix`
    may name the strategy ({strategy}), for Keras 3 why it cannot train there ({keras3}), and what the rule was
    given ({s.<attribute>}). A rule within one `group` takes that group's settings: it is also checked where the
    group is validated alone (a sweep checks its mlflow group before its parent run, runner.config.settings.
    mlflow_settings). The SWEEP group's rules take the sweep as its sweeper sees it (runner.sweeps.sweep_config.
    SweepConfig: the sweeper, the pruner and the sweep group together), checked before the sweep's parent run."""

    key: str
    breaks: Callable[[Any], bool]
    why: str
    fix: str
    path: str = ""
    group: str = ""

    def check(self, settings: Any, strategy: str | None = None) -> None:
        """Refuse `settings` (the whole Settings, or the rule's group's) if they break the rule."""
        if not self.breaks(settings):
            return
        words = {"strategy": strategy, "keras3": KERAS3_UNSUPPORTED.get(strategy or ""), "s": settings}
        where = (self.path or self.key).removeprefix(f"{self.group}." if self.group else "")
        raise refusal(
            self.key, operator.attrgetter(where)(settings), self.why.format(**words), self.fix.format(**words)
        )


# The group of the rules over a whole sweep (runner.sweeps.sweep_config.SweepConfig), not over a run's Settings.
SWEEP = "sweep_config"

RULES = (
    Rule(
        "strategy.cpu_replicas",
        lambda s: s.strategy.cpu_replicas is not None and not strategy_kind(s.strategy.name).splits_the_cpu,
        "strategy={strategy} cannot use several CPU replicas on one machine",
        "use strategy=mirrored or strategy=central_storage with it, or drop strategy.cpu_replicas",
    ),
    Rule(
        "strategy.cpu_replicas",
        lambda s: s.strategy.cpu_replicas is not None and s.strategy.devices is not None,
        "it conflicts with the explicit strategy.devices list",
        "give either strategy.devices or strategy.cpu_replicas, not both",
    ),
    Rule(
        "strategy.communication",
        lambda s: (
            s.strategy.communication != "auto" and not strategy_kind(s.strategy.name).all_reduces_across_processes
        ),
        "strategy={strategy} does not all-reduce across processes",
        "use it with strategy=multi_worker_mirrored, or drop strategy.communication",
    ),
    Rule(
        "strategy.variable_partitioner.max_shards",
        lambda s: (
            s.strategy.variable_partitioner.max_shards is not None and not strategy_kind(s.strategy.name).coordinated
        ),
        "strategy={strategy} keeps whole variables (only parameter servers hold shards)",
        "use it with strategy=parameter_server, or set it to null",
    ),
    Rule(
        "cluster",
        lambda s: s.cluster.kind == "none" and strategy_kind(s.strategy.name).multi_process,
        "strategy={strategy} trains in several processes that form a TensorFlow cluster",
        "add cluster=local to start one on this machine (cluster.workers=2, and cluster.ps=1 for "
        "parameter_server), or cluster=tf_config / cluster=slurm where TF_CONFIG or srun describe the cluster",
        path="cluster.kind",
    ),
    Rule(
        "cluster",
        lambda s: s.cluster.kind != "none" and not strategy_kind(s.strategy.name).multi_process,
        "strategy={strategy} trains in a single process",
        "use strategy=multi_worker_mirrored or strategy=parameter_server with a cluster, or drop the cluster override",
        path="cluster.kind",
    ),
    Rule(
        "loop.steps_per_epoch",
        lambda s: strategy_kind(s.strategy.name).coordinated and s.loop.steps_per_epoch is None,
        "strategy=parameter_server has no natural end of an epoch (each worker draws batches from its "
        "own endless dataset)",
        "pass a fixed number of steps per epoch, e.g. loop.steps_per_epoch=50",
    ),
    Rule(
        "runtime.deterministic",
        lambda s: s.runtime.deterministic and strategy_kind(s.strategy.name).coordinated,
        "strategy=parameter_server trains asynchronously: each worker applies its updates whenever it finishes "
        "a step, so the order of updates (and every number after the first step) depends on timing, and each "
        "worker shuffles with a seed of its own",
        "use strategy=multi_worker_mirrored (synchronous) for a reproducible multi-process run, or drop "
        "runtime.deterministic to train with parameter servers",
    ),
    Rule(
        "early_stopping.start_epoch",
        lambda s: s.early_stopping.patience is not None and s.early_stopping.start_epoch > s.epochs,
        "it comes after the run's last epoch (epochs), so no epoch would be watched",
        "pass a start_epoch no later than epochs, e.g. early_stopping.start_epoch=1",
    ),
    Rule(
        "mlflow.register",
        lambda mlflow: mlflow.register and not mlflow.log_model,
        "it needs the run's model, and mlflow.log_model=false skips logging it",
        "drop mlflow.log_model=false, or drop mlflow.register=true",
        group="mlflow",
    ),
    Rule(
        "pruner",
        lambda sweep: sweep.pruner is not None and not sweep.reports_to_a_study,
        "hydra.sweeper._target_={s.sweeper} reports its trials to no study that can prune them: only the runner's "
        "Optuna sweep (hparams_search=optuna) and a grid sweep (Hydra's basic sweeper) do",
        "sweep with hparams_search=optuna or a grid (-m optimizer.lr=0.01,0.001), or drop the pruner override",
        path="pruner_option",
        group=SWEEP,
    ),
    Rule(
        "pruner",
        lambda sweep: sweep.prunes_replicates and sweep.sweep.seeds < 2 and sweep.sweep.folds is None,
        "it compares a configuration's seeds or folds, one by one, with the best configuration's same seeds and "
        "folds, and this sweep trains each configuration once (sweep.seeds=1, sweep.folds=null)",
        "add sweep.folds=5 or sweep.seeds=5 (four replicates are the fewest it can prune on), or prune on epochs "
        "with pruner=median",
        path="pruner_option",
        group=SWEEP,
    ),
    Rule(
        "pruner",
        lambda sweep: sweep.pruner is not None and sweep.goals.several,
        "a pruner stops a trial whose one objective lags the others', and this sweep trades off several "
        "({s.objective_list}): Optuna cannot prune a study of several objectives",
        "drop the pruner (pruner=none), or sweep over one objective",
        path="pruner_option",
        group=SWEEP,
    ),
    Rule(
        "hydra.sweeper.terminate",
        lambda sweep: sweep.terminate is not None and sweep.goals.several,
        "it stops a study once its one best configuration can hardly improve, and this sweep trades off several "
        "objectives ({s.objective_list}), whose best configurations are a front, not one",
        "leave hydra.sweeper.terminate=null to run n_trials trials, or sweep over one objective",
        path="terminate",
        group=SWEEP,
    ),
    Rule(
        "sweep.objective",
        lambda sweep: (
            sweep.pruner is not None
            and not sweep.prunes_replicates
            and sweep.objective not in sweep.table.per_epoch_keys
        ),
        "pruner={s.pruner_option} compares each epoch's objective, and {s.objective} exists only once training has "
        "ended",
        "pass a per-epoch objective ({s.per_epoch_objectives}), e.g. sweep.objective=val_accuracy (a validation "
        "split's: a test-set objective makes the winner's test score optimistic), or pruner=none",
        path="objective",
        group=SWEEP,
    ),
    Rule(
        "hydra.sweeper.terminate",
        lambda sweep: sweep.terminate is not None and sweep.sweep.seeds < 2 and sweep.sweep.folds is None,
        "it stops the study once the most its best configuration could still improve is below the noise between "
        "that configuration's seeds or folds, and this sweep trains each configuration once (sweep.seeds=1, "
        "sweep.folds=null), so that noise is unknown",
        "add sweep.seeds=3 or sweep.folds=5, or leave hydra.sweeper.terminate=null to run n_trials trials",
        path="terminate",
        group=SWEEP,
    ),
    Rule(  # only the strategies Keras 3 supports upstream (runner.compat.keras3)
        "runtime.keras",
        lambda s: s.runtime.keras == 3 and s.strategy.name in KERAS3_UNSUPPORTED,
        "strategy={strategy} cannot train a Keras 3 model: {keras3}",
        "use runtime.keras=2 (tf_keras) with strategy={strategy}, or " + KERAS3_STRATEGIES,
    ),
)


def validate(config: Mapping[str, Any]) -> Settings:
    """Validate a composed config (a resolved DictConfig or plain mapping) into Settings."""
    settings = dataclasses.replace(schema.read(Settings, config), composed=config)
    table = settings.metric_table
    check_task_objective(table, settings.task.objective)
    check_metric_keys(table, settings.sweep, settings.task.objective)
    check_model_bytes_known(settings.sweep, settings.mlflow.log_model)
    check_monitor(table, settings.early_stopping.monitor)
    check_metrics_suit(settings.task.kind, settings.metrics)
    for rule in RULES:
        if rule.group != SWEEP:  # a sweep's, checked by its sweeper before its parent run
            rule.check(getattr(settings, rule.group) if rule.group else settings, settings.strategy.name)
    settings = _with_arguments(settings)
    return dataclasses.replace(settings, init=init_settings(schema.section(config, "init")))


def metric_table_of(config: Mapping[str, Any]) -> MetricTable:
    """The metric table of a composed config's `metrics` alone (a sweep's, before its jobs validate the rest)."""
    return schema.table_of(schema.read_metrics(config.get("metrics")))


def check_metric_keys(table: MetricTable, sweep: SweepSettings, score: str) -> None:
    """sweep.objective is one of the numbers a finished run of this table has, and sweep.direction does not go
    against it (or the default objective of the task's `score`) unless sweep.direction_against_metric says so."""
    why = "a sweep job can only return one of its final numbers"
    for objective in sweep.objectives:
        _check_metric_key(table.result_keys, "sweep.objective", objective, why)
    Objectives.of(sweep, score, table)  # refuses a direction against an objective's own, and bad constraints


def check_model_bytes_known(sweep: SweepSettings, log_model: bool = True) -> None:
    """sweep.objective=model_bytes (or a constraint on it) needs each run's model exported (`log_model`:
    mlflow.log_model, which a sweep checks in each job): its size is measured as it is logged."""
    if MODEL_BYTES not in sweep.objectives and not any(MODEL_BYTES in text for text in sweep.constraints):
        return
    if not log_model:
        why, fix = "mlflow.log_model=false exports no model", "drop mlflow.log_model=false"
    elif sweep.trial_models == "champion":
        why = "sweep.trial_models=champion exports only the chosen run's model, after every trial"
        fix = "pass sweep.trial_models=every"
    else:
        return
    raise RunnerError(
        f"sweep.objective=model_bytes is not valid: the exported model's size is measured as the model is "
        f"logged, and {why}. Fix: {fix}, or choose on parameters (which the size follows).",
        key="sweep.objective",
    )


def check_monitor(table: MetricTable, monitor: str | None) -> None:
    """early_stopping.monitor is a metric of every epoch of this table, and not the test set's."""
    _check_metric_key(table.epoch_keys(), "early_stopping.monitor", monitor, "it must be a metric of every epoch")
    if monitor is not None:
        refuse_test_monitor(monitor, f"early_stopping.monitor={monitor!r}")


def check_named_metrics(config: Mapping[str, Any]) -> None:
    """The keys of a composed config that name a metric of its table (task.objective, sweep.objective,
    early_stopping.monitor), checked alone: a sweep checks each of its points with them before its parent run."""
    sweep_settings(config)  # task.objective and sweep.objective
    stopping = schema.read(schema.EarlyStoppingSettings, schema.section(config, "early_stopping"), "early_stopping.")
    check_monitor(metric_table_of(config), stopping.monitor)


def check_task_objective(table: MetricTable, objective: str) -> None:
    """task.objective is one of the run's metrics (the loss or a score of `metrics`): a sweep chooses on val_<it>
    when sweep.objective is null, and mlflow.register ranks the model by it; refused where it is composed, in a
    single run as in a sweep, before anything trains."""
    names = tuple(metric.name for metric in table.model_metrics)
    why = "a sweep chooses on val_<it> when sweep.objective is null, and mlflow.register ranks the model by it: one "
    Choice(*names, why=f"{why}of the run's metrics, {', '.join(names)}")(
        "task.objective", objective, schema.fix_of(TaskSettings, "objective")
    )


def refuse_test_monitor(monitor: str, named: str) -> None:
    """An early-stopping monitor (`named`: the key and value as the user gave them, or its default) on the test set
    would choose the epoch training stops at and the checkpoint it keeps on the data that reports the result."""
    if monitor.startswith("test_"):
        raise RunnerError(
            f"{named} is not valid: it watches the test set, so the epoch training stops at and the checkpoint it "
            "keeps would be chosen on the data that reports the result, and the test score would be optimistic. "
            "Fix: watch a validation metric, e.g. early_stopping.monitor=val_loss (with "
            "dataset.validation_fraction=0.1 where the data has no validation split), or the training loss, "
            "early_stopping.monitor=train_loss.",
            key="early_stopping.monitor",
        )


def check_metrics_suit(kind_name: str, metrics: Any) -> None:
    """Each metric of `metrics` that the task's kind knows not to suit it (runner.task_kinds) is one paragraph,
    naming the metrics that do."""
    kind = KINDS.get(kind_name)
    if kind is None:
        return
    for each in metrics:
        target = each.component.target
        why = kind.unsuitable(target, snake_case(target.rpartition(".")[2]))
        if why is not None:
            raise RunnerError(
                f"metrics.{each.name}={target!r} is not valid: it does not suit task={kind.name} "
                f"({why}), so it would log a number that means nothing. Fix: drop it (~metrics.{each.name}) or "
                f"use a metric that suits task={kind.name}: {kind.suitable_metrics}.",
                key=f"metrics.{each.name}._target_",
            )


def _check_metric_key(keys: tuple[str, ...], key: str, value: str | None, why: str) -> None:
    group, _, name = key.partition(".")
    kind = {"sweep": SweepSettings, "early_stopping": schema.EarlyStoppingSettings}[group]
    Choice(*keys, why=f"{why}, {', '.join(keys)}")(key, value, schema.fix_of(kind, name), nullable=True)


def mlflow_settings(config: Mapping[str, Any]) -> MlflowSettings:
    """The mlflow group validated alone (what a sweep checks before its parent run, where a swept key may still
    change the rest of the config)."""
    settings = schema.read(MlflowSettings, schema.section(config, "mlflow"), "mlflow.")
    for rule in RULES:
        if rule.group == "mlflow":
            rule.check(settings)
    return settings


def sweep_settings(config: Mapping[str, Any]) -> SweepSettings:
    """The sweep group validated alone, its objective against the config's metrics: the objective and the seeds."""
    settings = schema.read(SweepSettings, schema.section(config, "sweep"), "sweep.")
    table = metric_table_of(config)
    score = task_settings(config).objective
    # The objective sweep.objective=null chooses on, val_<task.objective>, is then one of the runs' numbers.
    check_task_objective(table, score)
    check_metric_keys(table, settings, score)
    check_model_bytes_known(settings)
    return settings


def objective_of(config: Mapping[str, Any], hydra: Mapping[str, Any] | None = None) -> Objective:
    """The objective of a composed config (runner.config.objective) and its direction, hydra.sweeper.direction
    included; `hydra`: Hydra's node where `config` has none (a sweep job's config beside HydraConfig's)."""
    return objectives_of(config, hydra).chosen


def objectives_of(config: Mapping[str, Any], hydra: Mapping[str, Any] | None = None) -> Objectives:
    """Every objective of a composed config, its directions and constraints (runner.config.objective.Objectives)."""
    if hydra is None:
        hydra = config.get("hydra") or {}
    sweeper = hydra.get("sweeper") or {}
    score = task_settings(config).objective
    direction = sweeper.get("direction")
    if direction is not None and not isinstance(direction, str):
        direction = list(direction)  # one per objective (a list node of the config)
    return Objectives.of(sweep_settings(config), score, metric_table_of(config), direction)


@dataclasses.dataclass(frozen=True)
class JobValues:
    """A sweep job's own values, as composed: its training process validates them, so that a bad swept value fails
    that job and not the sweep. What decides the process its runs may train in is among them (strategy,
    cpu_replicas, deterministic, cluster_kind: runner.sweeps.launch.warm_pool)."""

    seed: Any
    epochs: int
    progress: Any
    validation_fraction: Any
    split_seed: Any
    strategy: Any
    cpu_replicas: Any
    deterministic: Any
    cluster_kind: Any


def job_values(config: Mapping[str, Any]) -> JobValues:
    """The JobValues of a sweep's or a job's composed config."""

    def value(path: str) -> Any:
        node: Any = config
        for part in path.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        return node

    return JobValues(
        seed=value("seed"),
        epochs=int(config["epochs"]),
        progress=value("progress"),
        validation_fraction=value("dataset.validation_fraction"),
        split_seed=value("dataset.split_seed"),
        strategy=value("strategy.name"),
        cpu_replicas=value("strategy.cpu_replicas"),
        deterministic=value("runtime.deterministic"),
        cluster_kind=value("cluster.kind"),
    )


def pruner_node(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `pruner` group as a plain mapping ({_target_: ..., arguments}), or None for pruner=none; its `_target_`
    and arguments are checked where the pruner is made (runner.sweeps.study.pruning)."""
    node = config.get("pruner")
    if node is None:
        return None
    plain = dict(as_plain(node))
    return plain if plain.get("_target_") else None


def optuna_sweeper_settings(node: Mapping[str, Any]) -> schema.OptunaSweeperSettings:
    """The Optuna sweeper's node (`hydra.sweeper`), each key checked by its declaration; a direction given as Hydra's
    Direction enum (a config written for hydra-optuna-sweeper) is read by its name."""
    defaults = {item.name: item.default for item in dataclasses.fields(schema.OptunaSweeperSettings)}
    unknown = sorted(str(key) for key in node if key not in defaults and key != "_target_")
    if unknown:
        raise RunnerError(
            f"hydra.sweeper.{unknown[0]} is not a key of the runner's Optuna sweeper (its keys: "
            f"{', '.join(defaults)}). Fix: drop it"
            + (", and give the search space as hydra.sweeper.params" if unknown[0] == "search_space" else "")
            + " (the runner's sweeper takes Hydra's Optuna sweeper's keys but this one).",
            key=f"hydra.sweeper.{unknown[0]}",
        )
    direction = node.get("direction")
    plain = {**defaults, **node, "direction": getattr(direction, "name", direction)}
    return schema.read(schema.OptunaSweeperSettings, plain, "hydra.sweeper.")


def task_settings(config: Mapping[str, Any]) -> TaskSettings:
    """The task group validated alone."""
    return schema.read(TaskSettings, schema.section(config, "task"), "task.")


def target_components(config: Mapping[str, Any], groups: tuple[str, ...] = TARGET_GROUPS) -> list[Component]:
    """The `_target_` callables of a composed config with the arguments it gives them, without validating the rest."""
    found = [schema.target(name, schema.section(config, name)) for name in groups]
    return [each for each in found if each is not None]


def checked_targets(settings: Settings, metrics: bool = True) -> Settings:
    """Settings whose `_target_` callables import and take the arguments their config gives (one paragraph
    otherwise). A null argument the callable does not take is left out: an option's `dir: null` does not stick
    to a `_target_` given on the command line. `metrics=False` leaves the metrics' for checked_metric_targets:
    their Keras classes import TensorFlow, which `python -m runner` loads only once its tracker's process is
    opening MLflow on the other core."""
    paths = REQUIRED_TARGET_PATHS
    checked = check_targets([operator.attrgetter(path)(settings) for path in paths], TARGET_ARGUMENTS)
    for path, component in zip(paths, checked, strict=True):
        settings = _replaced(settings, path, component)
    return checked_metric_targets(settings) if metrics else settings


def checked_metric_targets(settings: Settings) -> Settings:
    """Settings whose metrics' `_target_` classes import and take the arguments their config gives."""
    metrics = [each.component for each in settings.metrics]
    scores = check_targets(metrics, {each.group: ((), 0) for each in metrics})  # the runner supplies no argument
    return dataclasses.replace(
        settings,
        metrics=tuple(dataclasses.replace(each, component=c) for each, c in zip(settings.metrics, scores, strict=True)),
    )


def _replaced(node: Any, path: str, value: Any) -> Any:
    """`node` (frozen settings) with the field at the dotted `path` replaced by `value`."""
    first, _, rest = path.partition(".")
    return dataclasses.replace(node, **{first: _replaced(getattr(node, first), rest, value) if rest else value})


_DATA_DIR_FIX = (
    "point dataset.dir at the directory holding the data (fashion_mnist: the four IDX files{}, or null to use "
    "tf.keras.datasets; image_folder: its train/ and test/ folders)"
)


def _with_arguments(settings: Settings) -> Settings:
    """The built-in arguments the runner knows the meaning of checked (dataset.dir, model.weight_decay), and
    dataset.dir's `~` expanded."""
    arguments = settings.dataset.component.arguments
    directory = arguments.get("dir")
    if directory is not None and (not isinstance(directory, str) or not directory):
        raise refusal("dataset.dir", directory, "it must be a directory's path or null", _DATA_DIR_FIX.format(""))
    if directory is not None and not os.path.isdir(directory := os.path.expanduser(directory)):
        raise refusal(
            "dataset.dir", directory, "no such directory", _DATA_DIR_FIX.format(" train-images-idx3-ubyte.gz, ...")
        )
    if "weight_decay" in settings.model.arguments:
        fix = "pass a non-negative L2 factor, e.g. model.weight_decay=1e-5"
        Number()("model.weight_decay", settings.model.arguments["weight_decay"], fix)
    if directory is not None:
        settings = _replaced(settings, "dataset.component.arguments", {**arguments, "dir": directory})
    return settings


_INIT_FIX = (
    "pass a run directory of an earlier run (or its checkpoints/ directory), runs:/<run id>/model, "
    "models:/<name>@<alias> (e.g. models:/fashion_mnist@champion), models:/<name>/<version> or a LoggedModel's id "
    "(m-<32 hex digits>, or models:/m-...); or init.from=null to start from the model's own initialisation"
)
# An MLflow 3 LoggedModel's id (mlflow.search_logged_models, the run's Models tab), alone or as models:/<id>.
_LOGGED_MODEL_ID = re.compile(r"(?:models:/)?(m-[0-9a-f]{32})")


def init_settings(node: Mapping[str, Any]) -> InitSettings:
    """The init group, whose one key init.from is runs:/<run id>/<path>, models:/<name>@<alias>,
    models:/<name>/<version>, a LoggedModel id (m-<hex>, or models:/m-<hex>), or a run directory, its
    checkpoints/ directory or one checkpoint (a ckpt-N prefix) that exists; its kind is found by looking at the
    value."""
    for key in node:
        if key != "from":
            raise refusal(
                f"init.{key}",
                node[key],
                "the init group has one key, init.from",
                "give where the weights come from as init.from=<run dir, runs:/ or models:/ URI>",
            )
    source = TEXT("init.from", node.get("from"), _INIT_FIX, nullable=True)
    if source is None:
        return InitSettings(None, None)
    logged_model = _LOGGED_MODEL_ID.fullmatch(source)
    if logged_model:
        return InitSettings(logged_model.group(1), "logged_model")
    if source.startswith("runs:"):
        if not re.fullmatch(r"runs:/[^/\s]+/\S+", source):
            raise refusal("init.from", source, "a run's model is named runs:/<run id>/<artifact path>", _INIT_FIX)
        return InitSettings(source, "runs")
    if source.startswith("models:"):
        if not re.fullmatch(r"models:/[^/@:\s]+(@[^/@\s]+|/\d+)", source):
            why = "a registered model's version is named models:/<name>@<alias> or models:/<name>/<version number>"
            raise refusal("init.from", source, why, _INIT_FIX)
        return InitSettings(source, "models")
    if re.match(r"[A-Za-z][\w+.-]*:/", source):
        why = "the runner loads weights from runs:/ and models:/ URIs and from local checkpoint directories"
        raise refusal("init.from", source, why, _INIT_FIX)
    path = os.path.abspath(os.path.expanduser(source))
    if os.path.isfile(path + ".index"):  # one checkpoint, named by its prefix (.../checkpoints/ckpt-96)
        return InitSettings(path, "checkpoint")
    if not os.path.isdir(path):
        why = f"there is no directory {path} (nor a checkpoint of that name), and it is not a runs:/ or models:/ URI"
        raise refusal("init.from", source, why, _INIT_FIX)
    for directory in (path, os.path.join(path, "checkpoints")):
        if os.path.isfile(os.path.join(directory, "checkpoint")) or glob.glob(os.path.join(directory, "ckpt-*.index")):
            return InitSettings(directory, "checkpoint")
    why = f"{path} holds no checkpoint (no ckpt-*.index files in it or in its checkpoints/ directory)"
    raise refusal("init.from", source, why, _INIT_FIX)

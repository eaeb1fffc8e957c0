"""A sweep's composed config, read once: what the sweep's callback and each of its jobs use of it, typed.

The sweep's process reads its own (SweepConfig.read(config), its `hydra` node included); each job reads its job's
config with HydraConfig's node beside it, at the start of runner.sweeps.job.job.run_sweep_job. Below those two points
nothing reads the raw config's keys. The `sweep` and `mlflow` groups are validated here (the callback has already
refused a bad value of them before the parent run exists: runner.config.check.check_sweep_points); a job's own
`seed` and dataset values are kept as composed, since a bad swept value is its training process's to refuse,
which fails that job and not the sweep.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from runner.config.schema import MlflowSettings, SweepSettings
from runner.config.settings import metric_table_of, mlflow_settings, sweep_settings, task_settings
from runner.errors import RunnerError
from runner.metric_table import MetricTable
from runner.outcome import default_objective, fallback_objective
from runner.sweeps.terms import SWEEPER_TARGET, worst_value

# Hydra's own sweeper (a grid, `-m optimizer.lr=0.01,0.001`): with a pruner, its jobs report to a grid study
# (runner.sweeps.study.grid_study).
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
# The `pruner` group's options, by their _target_.
PRUNER_OPTIONS = {
    "optuna.pruners.WilcoxonPruner": "wilcoxon",
    "optuna.pruners.MedianPruner": "median",
    "optuna.pruners.SuccessiveHalvingPruner": "successive_halving",
    "optuna.pruners.HyperbandPruner": "hyperband",
}
# Pruners that compare a trial's replicates (its seeds and folds) rather than its epochs: the sweep job reports each
# run's final objective as the step of its replicate (runner.sweeps.study.pruning.report_replicate); the training
# process
# reports no epoch.
REPLICATE_PRUNERS = ("optuna.pruners.WilcoxonPruner",)


def sweep_dir_of(config: DictConfig) -> str:
    """The sweep's directory (hydra.sweep.dir), absolute: `config` is the sweep's composed config."""
    return os.path.abspath(str(config.hydra.sweep.dir))


def swept_keys(config: DictConfig) -> list[str]:
    """Keys whose value differs between jobs: sweep overrides (batch=32,64) and the sweeper's own search space
    (hydra.sweeper.params, as optuna has)."""
    overrides = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
    keys = [override.key_or_group for override in overrides if override.is_sweep_override()]
    params = OmegaConf.select(config, "hydra.sweeper.params")
    for key in params or {}:
        if key not in keys:
            keys.append(str(key))
    return keys


def pruner_node(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `pruner` group as a plain mapping ({_target_: ..., arguments}), or None for pruner=none."""
    node = config.get("pruner")
    if node is None:
        return None
    plain = dict(_plain(node))
    return plain if plain.get("_target_") else None


def _plain(node: Any) -> Mapping[str, Any]:
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]  # a mapping node
    return node


def direction_of(sweeper: Any, sweep: Any) -> str | None:
    """The sweep's direction: the Optuna sweeper's (hydra.sweeper.direction, an enum or its name) or sweep.direction,
    which must agree where both are set; None: the objective's own (runner.metric_table)."""
    sweeper = getattr(sweeper, "name", sweeper)
    if sweeper is not None and sweep is not None and sweeper != sweep:
        raise RunnerError(
            f"hydra.sweeper.direction={sweeper} is not valid with sweep.direction={sweep}: a sweep has one "
            "direction. Fix: set one of them, or neither for the objective's own direction."
        )
    chosen = sweeper if sweeper is not None else sweep
    return None if chosen is None else str(chosen)


@dataclass(frozen=True)
class SweepConfig:
    """What a sweep is asked to do, from its composed config (see the module's docstring for who reads it)."""

    tracking: MlflowSettings  # the `mlflow` group: the store, the experiment, the model and its registry name
    sweep: SweepSettings  # the `sweep` group: objective, seeds, folds
    direction: str | None  # hydra.sweeper.direction or sweep.direction (None: the objective's own, runner.metric_table)
    sweeper: str | None  # hydra.sweeper._target_
    pruner: dict[str, Any] | None  # the `pruner` group ({_target_: ..., its arguments}), None for pruner=none
    terminate: Any  # hydra.sweeper.terminate: an Optuna study's terminator (runner.sweeps.study.terminator), None: none
    table: MetricTable  # the jobs' metrics, from the `metrics` group: what the objective can be, and its direction
    score: str  # task.objective: the score a null sweep.objective chooses on (val_<it>, test_<it> as the fallback)
    epochs: int  # a trial's runs continue one another's steps, epochs apart
    # A job's own values, as composed (its training process validates them).
    seed: Any
    progress: Any
    validation_fraction: Any
    split_seed: Any
    # What decides the process a job's runs may train in (runner.sweeps.launch.warm_pool.worker_kind), as composed.
    strategy: Any
    cpu_replicas: Any
    deterministic: Any
    cluster_kind: Any

    @classmethod
    def read(cls, config: DictConfig, hydra: DictConfig | None = None) -> SweepConfig:
        """`config`: the sweep's or a job's composed config; `hydra`: the `hydra` node, where `config` has none
        (a job's task config: HydraConfig.get()); without either, the sweeper's defaults."""
        if hydra is None:
            hydra = config.get("hydra") or OmegaConf.create({})
        sweep = sweep_settings(config)
        table = metric_table_of(config)
        sweeper_direction = OmegaConf.select(hydra, "sweeper.direction")
        direction = direction_of(sweeper_direction, sweep.direction)  # the two agree, or this refuses
        objective = sweep.objective or default_objective(task_settings(config).objective)
        against = sweep.direction_against_metric
        table.check_direction(objective, sweeper_direction, "hydra.sweeper.direction", against)
        return cls(
            tracking=mlflow_settings(config),
            sweep=sweep,
            direction=direction,
            sweeper=OmegaConf.select(hydra, "sweeper._target_"),
            pruner=pruner_node(config),
            terminate=OmegaConf.select(hydra, "sweeper.terminate"),
            table=table,
            score=task_settings(config).objective,
            seed=config.get("seed"),
            epochs=int(config.epochs),
            progress=config.get("progress"),
            validation_fraction=OmegaConf.select(config, "dataset.validation_fraction"),
            split_seed=OmegaConf.select(config, "dataset.split_seed"),
            strategy=OmegaConf.select(config, "strategy.name"),
            cpu_replicas=OmegaConf.select(config, "strategy.cpu_replicas"),
            deterministic=OmegaConf.select(config, "runtime.deterministic"),
            cluster_kind=OmegaConf.select(config, "cluster.kind"),
        )

    @property
    def tracking_uri(self) -> str | None:
        """mlflow.tracking_uri, None for MLflow's default (MLFLOW_TRACKING_URI, else ./mlflow.db)."""
        return self.tracking.tracking_uri or None

    @property
    def objective(self) -> str:
        """The metric a job returns to the sweeper (sweep.objective; null: the task's score on validation)."""
        return self.sweep.objective or default_objective(self.score)

    @property
    def fallback_objective(self) -> str:
        """What a null sweep.objective chooses on where the data cannot be split: the task's score on test."""
        return fallback_objective(self.score)

    @property
    def objective_is_default(self) -> bool:
        """sweep.objective was left null: the sweep chooses on validation, or on test where the data cannot be
        split."""
        return self.sweep.objective is None

    @property
    def lower_is_better(self) -> bool:
        return self.table.lower_is_better(self.objective, self.direction)

    @property
    def worst(self) -> float:
        """What a failed job returns (runner.sweeps.terms.worst_value)."""
        return worst_value(self.objective, self.direction, self.table)

    @property
    def seeds(self) -> list[Any]:
        """The seeds a job trains: its `seed`, then the next sweep.seeds - 1 integers (its `seed` alone when that
        is not an integer: its training process refuses it and the job is FAILED)."""
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            return [self.seed]
        return [self.seed + offset for offset in range(self.sweep.seeds)]

    @property
    def prunes_replicates(self) -> bool:
        """The sweep's pruner compares replicates, not epochs (REPLICATE_PRUNERS: pruner=wilcoxon)."""
        return self.pruner is not None and self.pruner["_target_"] in REPLICATE_PRUNERS

    @property
    def pruner_option(self) -> str | None:
        """The pruner's option (`median`), or its `_target_` where it is none of the runner's; None: no pruner."""
        if self.pruner is None:
            return None
        target = self.pruner["_target_"]
        return PRUNER_OPTIONS.get(target, f"<pruner._target_={target}>")  # runner.sweeps.study.pruning's words too

    @property
    def per_epoch_objectives(self) -> str:
        """The objectives its jobs have after every epoch, as a pruner's refusal lists them."""
        return ", ".join(self.table.per_epoch_keys)

    @property
    def reports_to_a_study(self) -> bool:
        """Its jobs report their epochs or replicates to a study a pruner can stop them by: an Optuna sweep, or a grid
        of Hydra's basic sweeper (runner.sweeps.study.grid_study)."""
        return self.sweeper in (SWEEPER_TARGET, BASIC_SWEEPER)

    @property
    def prunes_a_grid(self) -> bool:
        """A sweep with a pruner that is not an Optuna sweep (runner.sweeps.study.pruning.check_sweep allows only
        Hydra's
        basic sweeper besides): its jobs report to a grid study (runner.sweeps.study.grid_study)."""
        return self.pruner is not None and self.sweeper != SWEEPER_TARGET

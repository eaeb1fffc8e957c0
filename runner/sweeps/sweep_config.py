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
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, ListConfig, OmegaConf

from runner.config.objective import Objective, Objectives
from runner.config.schema import MlflowSettings, OptunaSweeperSettings, SweepSettings
from runner.config.settings import (
    JobValues,
    job_values,
    metric_table_of,
    mlflow_settings,
    optuna_sweeper_settings,
    pruner_node,
    sweep_settings,
    task_settings,
)
from runner.metric_table import MetricTable
from runner.sweeps.terms import DEFAULT_STUDY_NAME, JOURNAL_FILE, SWEEPER_TARGET

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
# process reports no epoch.
REPLICATE_PRUNERS = ("optuna.pruners.WilcoxonPruner",)


def _plain(node: Any) -> Any:
    """A config value as plain Python (a list of directions as a list)."""
    return OmegaConf.to_container(node) if isinstance(node, (DictConfig, ListConfig)) else node


def pruner_option(target: str) -> str:
    """How a refusal names a pruner: its option (`median`), or its `_target_` where it is none of the runner's."""
    return PRUNER_OPTIONS.get(target, f"<pruner._target_={target}>")


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


def storage_of(storage: str | None, sweep_dir: str) -> str:
    """An Optuna study's storage as runner.sweeps.study opens it: a database URL (sqlite:///..., postgresql://...) as
    given, else the absolute path of a journal file (`hydra.sweeper.storage=null`: optuna_study.journal in the sweep
    directory)."""
    if not storage:
        return os.path.join(os.path.abspath(sweep_dir), JOURNAL_FILE)
    return storage if "://" in storage else os.path.abspath(storage)


@dataclass(frozen=True)
class StudyAddress:
    """Where an Optuna sweep's study lives (a database URL or a journal file's absolute path) and its name."""

    storage: str
    name: str = DEFAULT_STUDY_NAME  # "": the storage's only study (a report that found the storage alone)

    @classmethod
    def of(cls, settings: OptunaSweeperSettings, sweep_dir: str) -> StudyAddress:
        """The study the Optuna sweeper's `settings` name, its journal (storage null) in `sweep_dir`."""
        return cls(storage_of(settings.storage, sweep_dir), settings.study_name or DEFAULT_STUDY_NAME)


@dataclass(frozen=True)
class SweepConfig:
    """What a sweep is asked to do, from its composed config (see the module's docstring for who reads it)."""

    tracking: MlflowSettings  # the `mlflow` group: the store, the experiment, the model and its registry name
    sweep: SweepSettings  # the `sweep` group: objective, seeds, folds
    goals: Objectives  # what the jobs return, their directions, what chooses, the constraints
    sweeper: str | None  # hydra.sweeper._target_
    optuna: OptunaSweeperSettings | None  # the Optuna sweeper's settings (hydra.sweeper); None: another sweeper
    sweep_dir: str | None  # hydra.sweep.dir, absolute
    pruner: dict[str, Any] | None  # the `pruner` group ({_target_: ..., its arguments}), None for pruner=none
    # A job's own values, as composed (its training process validates them): its seed, its epochs (a trial's runs
    # continue one another's steps, epochs apart), what decides the process its runs may train in.
    job: JobValues

    @classmethod
    def read(cls, config: DictConfig, hydra: DictConfig | None = None) -> SweepConfig:
        """`config`: the sweep's or a job's composed config; `hydra`: the `hydra` node, where `config` has none
        (a job's task config: HydraConfig.get()); without either, the sweeper's defaults."""
        if hydra is None:
            hydra = config.get("hydra") or OmegaConf.create({})
        sweeper = OmegaConf.select(hydra, "sweeper._target_")
        optuna = optuna_sweeper_settings(hydra.sweeper) if sweeper == SWEEPER_TARGET else None
        sweep_dir = OmegaConf.select(hydra, "sweep.dir")
        sweep = sweep_settings(config)
        return cls(
            tracking=mlflow_settings(config),
            sweep=sweep,
            goals=Objectives.of(
                sweep,
                task_settings(config).objective,
                metric_table_of(config),
                _plain(OmegaConf.select(hydra, "sweeper.direction")),  # the two directions agree, or this refuses
            ),
            sweeper=sweeper,
            optuna=optuna,
            sweep_dir=None if sweep_dir is None else os.path.abspath(str(sweep_dir)),
            pruner=pruner_node(config),
            job=job_values(config),
        )

    @property
    def tracking_uri(self) -> str | None:
        """mlflow.tracking_uri, None for MLflow's default (MLFLOW_TRACKING_URI, else ./mlflow.db)."""
        return self.tracking.tracking_uri or None

    @property
    def goal(self) -> Objective:
        """The objective the sweep chooses its best configuration by (its only one, or sweep.choose among several)."""
        return self.goals.chosen

    @property
    def objective_list(self) -> str:
        """The sweep's objectives, as a refusal names them."""
        return ", ".join(self.goals.names)

    @property
    def objective(self) -> str:
        """The metric a job returns to the sweeper (sweep.objective; null: the task's score on validation)."""
        return self.goal.name

    @property
    def direction(self) -> str | None:
        """hydra.sweeper.direction or sweep.direction; None: the objective's own (runner.metric_table)."""
        return self.goal.direction

    @property
    def table(self) -> MetricTable:
        """The jobs' metrics, from the `metrics` group: what the objective can be, and its direction."""
        return self.goal.table

    @property
    def score(self) -> str:
        """task.objective: the score a null sweep.objective chooses on (val_<it>, test_<it> as the fallback)."""
        return self.goal.score

    @property
    def fallback_objective(self) -> str:
        """What a null sweep.objective chooses on where the data cannot be split: the task's score on test."""
        return self.goal.fallback

    @property
    def objective_is_default(self) -> bool:
        """sweep.objective was left null: the sweep chooses on validation, or on test where the data cannot be
        split."""
        return self.goal.is_default

    @property
    def lower_is_better(self) -> bool:
        return self.goal.lower_is_better()

    @property
    def worst(self) -> float:
        """What a failed job returns: a value that can never be the best one (the runner's Optuna sweeper records
        such a trial as FAIL)."""
        return self.goal.worst

    @property
    def worst_answer(self) -> float | list[float]:
        """What a failed job returns: the worst value, or one per objective in a sweep over several."""
        return [goal.worst for goal in self.goals.each] if self.goals.several else self.goal.worst

    @property
    def terminate(self) -> str | None:
        """hydra.sweeper.terminate: an Optuna study's terminator (runner.sweeps.study.terminator); None: none."""
        return None if self.optuna is None else self.optuna.terminate

    @property
    def study(self) -> StudyAddress | None:
        """Where an Optuna sweep's study lives and its name; None: not an Optuna sweep."""
        if self.optuna is None or self.sweep_dir is None:
            return None
        return StudyAddress.of(self.optuna, self.sweep_dir)

    @property
    def seeds(self) -> list[Any]:
        """The seeds a job trains: its `seed`, then the next sweep.seeds - 1 integers (its `seed` alone when that
        is not an integer: its training process refuses it and the job is FAILED)."""
        if isinstance(self.job.seed, bool) or not isinstance(self.job.seed, int):
            return [self.job.seed]
        return [self.job.seed + offset for offset in range(self.sweep.seeds)]

    @property
    def prunes_replicates(self) -> bool:
        """The sweep's pruner compares replicates, not epochs (REPLICATE_PRUNERS: pruner=wilcoxon)."""
        return self.pruner is not None and self.pruner["_target_"] in REPLICATE_PRUNERS

    @property
    def pruner_option(self) -> str | None:
        """The pruner's option (`median`), or its `_target_` where it is none of the runner's; None: no pruner."""
        return None if self.pruner is None else pruner_option(self.pruner["_target_"])

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
        Hydra's basic sweeper besides): its jobs report to a grid study (runner.sweeps.study.grid_study)."""
        return self.pruner is not None and self.sweeper != SWEEPER_TARGET

"""Pruning (the `pruner` group: none, median, successive_halving, hyperband): what a sweep checks before its parent
run, and the listener through which a trial's training process reports its objective after each epoch and stops
at that epoch's boundary when the study's pruner says so.

The training process finds its trial through runner.sweeps.study.TrialLink (set by its sweep job); the pruner
itself is the job's own `pruner` config (an Optuna study does not store its pruner), built here the same way in
every trial."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from hydra.utils import instantiate
from omegaconf import OmegaConf

from runner.config.components import check_arguments, import_target
from runner.config.settings import sweep_settings
from runner.errors import RunnerError
from runner.metric_table import DEFAULT_TABLE
from runner.sweeps.study import PRUNED_TAG, TrialLink, is_optuna_sweep
from runner.sweeps.sweep_config import REPLICATE_PRUNERS, SweepConfig, pruner_node
from runner.sweeps.terms import objective_name

log = logging.getLogger("runner")

PRUNERS = ("none", "median", "successive_halving", "hyperband", "wilcoxon")
# The objectives a training process has after every epoch (runner.training.controller.EpochResult.metrics).
PER_EPOCH = DEFAULT_TABLE.per_epoch_keys
# Hydra's own sweeper (a grid, `-m optimizer.lr=0.01,0.001`): with a pruner, its jobs report to a grid study
# (runner.sweeps.grid_study).
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def check_pruner(config: Any) -> None:
    """Before a sweep's parent run exists: its pruner imports and takes the arguments its option gives, and the sweep
    can prune (an Optuna or a grid sweep, a per-epoch objective). Any strategy: under MultiWorkerMirrored every worker
    stops with the chief (runner.clusters.agreement), under ParameterServer the coordinator, which alone trains."""
    node = pruner_node(config)
    if node is None:
        return
    target = node.pop("_target_")
    check_arguments("pruner._target_", target, import_target("pruner._target_", target), node)
    sweeper = OmegaConf.select(config, "hydra.sweeper._target_")
    if not is_optuna_sweep(config) and sweeper != BASIC_SWEEPER:
        raise RunnerError(
            f"pruner={_option(target)} is not valid with hydra.sweeper._target_={sweeper}: only the runner's Optuna "
            "sweep (hparams_search=optuna) and a grid sweep (Hydra's basic sweeper) report their trials to a "
            "study that can prune them. Fix: sweep with hparams_search=optuna or a grid (-m optimizer.lr=0.01,0.001), "
            "or drop the pruner override."
        )
    if target in REPLICATE_PRUNERS:
        _check_replicates(config, target)
        return
    objective = objective_name(config)
    if objective not in PER_EPOCH:
        raise RunnerError(
            f"sweep.objective={objective} is not valid with pruner={_option(target)}: a pruner compares each "
            f"epoch's objective, and {objective} exists only once training has ended. Fix: pass a per-epoch "
            f"objective ({', '.join(PER_EPOCH)}), e.g. sweep.objective=val_accuracy (a validation split's: a "
            "test-set objective makes the winner's test score optimistic), or pruner=none."
        )


def _check_replicates(config: Any, target: str) -> None:
    """A replicate pruner needs replicates: several seeds or folds per configuration."""
    settings = sweep_settings(config)
    if settings.seeds < 2 and settings.folds is None:
        raise RunnerError(
            f"pruner={_option(target)} is not valid without replicates: it compares a configuration's seeds or "
            "folds, one by one, with the best configuration's same seeds and folds, and this sweep trains each "
            "configuration once (sweep.seeds=1, sweep.folds=null). Fix: add sweep.folds=5 or sweep.seeds=5 (four "
            "replicates are the fewest it can prune on), or prune on epochs with pruner=median."
        )


def report_replicate(link: TrialLink, config: SweepConfig, replicate: int, value: float) -> bool:
    """After a trial's run of replicate `replicate` (its index among the trial's seeds and folds, the same in every
    trial): its objective goes to the trial as that step, and the replicate pruner decides. True: the trial is
    pruned (PRUNED_TAG set to the epoch its runs stopped after, their last), and its other runs do not train."""
    _, trial = link.open(instantiate(config.pruner))
    trial.report(value, replicate)
    if not trial.should_prune():
        return False
    trial.set_user_attr(PRUNED_TAG, config.epochs)
    log.info(
        "trial %d pruned after %d replicate(s): its %s is significantly behind the best trial's on the same seeds "
        "and folds; its other replicates do not train",
        trial.number,
        replicate + 1,
        config.objective,
    )
    return True


def _option(target: str) -> str:
    names = {
        "optuna.pruners.WilcoxonPruner": "wilcoxon",
        "optuna.pruners.MedianPruner": "median",
        "optuna.pruners.SuccessiveHalvingPruner": "successive_halving",
        "optuna.pruners.HyperbandPruner": "hyperband",
    }
    return names.get(target, f"<pruner._target_={target}>")


class TrialReporter:
    """A controller listener: after each epoch, the objective goes to the trial and the pruner decides; a pruned
    trial's `stop_requested` stops training at this epoch's boundary."""

    def __init__(self, trial, objective: str, first_step: int = 0):
        self.trial = trial
        self.objective = objective
        self.first_step = first_step  # the trial's step before this run's epoch 1 (TrialLink.first_step)
        self.pruned_at_epoch: int | None = None

    @property
    def stop_requested(self) -> bool:
        return self.pruned_at_epoch is not None

    def on_epoch_end(self, result) -> None:
        self.trial.report(result.metrics()[self.objective], self.first_step + result.epoch)
        if self.trial.should_prune():
            self.pruned_at_epoch = result.epoch
            self.trial.set_user_attr(PRUNED_TAG, result.epoch)
            log.info(
                "trial %d pruned at epoch %d: its %s (%.4f) is behind the study's; training stops here",
                self.trial.number,
                result.epoch,
                self.objective,
                result.metrics()[self.objective],
            )

    def on_checkpoint_saved(self, epoch: int, files: list[str]) -> None:
        pass


def trial_reporter(config: Mapping[str, Any], chief: bool) -> TrialReporter | None:
    """The listener of a trial's training process (its sweep job set TrialLink's variable: an Optuna sweep's trial,
    or a pruned grid sweep's job), None outside those; a pruner outside a sweep is refused, before any MLflow run
    exists."""
    node = pruner_node(config)
    link = TrialLink.from_environment()
    if link is None:
        if node is not None:
            raise RunnerError(
                f"pruner={_option(node['_target_'])} is not valid without a sweep: a pruner stops a sweep's trials "
                "whose epochs are worse than the trials' before them, and this is a single run. Fix: sweep (-m with "
                "hparams_search=optuna, or a grid such as -m optimizer.lr=0.01,0.001), or drop the pruner override "
                "(pruner=none)."
            )
        return None
    if not chief or node is not None and node["_target_"] in REPLICATE_PRUNERS:
        return None  # a replicate pruner's reports are the job's, one per run (report_replicate)
    import optuna  # noqa: PLC0415  Optuna: only in a sweep's training (every training process reads this module)

    # pruner=none still reports each epoch (the study's intermediate values), and never prunes.
    _, trial = link.open(instantiate(node) if node is not None else optuna.pruners.NopPruner())
    return TrialReporter(trial, objective_name(config), link.first_step)

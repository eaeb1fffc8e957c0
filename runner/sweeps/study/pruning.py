"""Pruning (the `pruner` group: none, median, successive_halving, hyperband): what a sweep checks before its parent
run, and the listener through which a trial's training process reports its objective after each epoch and stops
at that epoch's boundary when the study's pruner says so.

The training process finds its trial through runner.sweeps.study.study.TrialLink (set by its sweep job); the pruner
itself is the job's own `pruner` config (an Optuna study does not store its pruner), built here the same way in
every trial."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from hydra.utils import instantiate

from runner.config.components import check_arguments, import_target
from runner.config.settings import RULES, SWEEP, objectives_of, pruner_node
from runner.errors import RunnerError
from runner.sweeps.study.study import PRUNED_TAG, TrialLink
from runner.sweeps.sweep_config import REPLICATE_PRUNERS, SweepConfig, pruner_option

log = logging.getLogger("runner")


def check_sweep(config: Any, sweep: SweepConfig) -> None:
    """Before a sweep's parent run exists: its pruner, if any, imports and takes the arguments its option gives, and
    the sweep keeps the SWEEP rules of runner.config.settings (a pruner needs an Optuna or a grid sweep, replicates
    for a replicate pruner, a per-epoch objective for the others; a terminator needs replicates). A pruner works under
    any strategy: under MultiWorkerMirrored every worker stops with the chief (runner.clusters.agreement), under
    ParameterServer the coordinator, which alone trains. `sweep`: the sweep's config, read (SweepConfig.read)."""
    node = pruner_node(config)
    if node is not None:
        target = node.pop("_target_")
        check_arguments("pruner._target_", target, import_target("pruner._target_", target), node)
    for rule in RULES:
        if rule.group == SWEEP:
            rule.check(sweep)


def report_replicate(link: TrialLink, config: SweepConfig, replicate: int, value: float) -> bool:
    """After a trial's run of replicate `replicate` (its index among the trial's seeds and folds, the same in every
    trial): its objective goes to the trial as that step, and the replicate pruner decides. True: the trial is
    pruned (PRUNED_TAG set to the epoch its runs stopped after, their last), and its other runs do not train."""
    _, trial = link.open(instantiate(config.pruner))
    trial.report(value, replicate)
    if not trial.should_prune():
        return False
    trial.set_user_attr(PRUNED_TAG, config.job.epochs)
    log.info(
        "trial %d pruned after %d replicate(s): its %s is significantly behind the best trial's on the same seeds "
        "and folds; its other replicates do not train",
        trial.number,
        replicate + 1,
        config.objective,
    )
    return True


class TrialReporter:
    """A controller listener: after each epoch, the objective goes to the trial and the pruner decides; a pruned
    trial's `stop_requested` stops training at this epoch's boundary."""

    finishes = False  # a pruned trial's run is stopped, not done: its `stopped` end actions run

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
                f"pruner={pruner_option(node['_target_'])} is not valid without a sweep: a pruner stops a sweep's "
                "trials whose epochs are worse than the trials' before them, and this is a single run. Fix: sweep "
                "(-m with hparams_search=optuna, or a grid such as -m optimizer.lr=0.01,0.001), or drop the pruner "
                "override (pruner=none)."
            )
        return None
    if not chief or node is not None and node["_target_"] in REPLICATE_PRUNERS:
        return None  # a replicate pruner's reports are the job's, one per run (report_replicate)
    goals = objectives_of(config)
    if goals.several:
        return None  # Optuna takes no intermediate value in a study of several objectives (and prunes none)
    import optuna  # noqa: PLC0415  Optuna: only in a sweep's training (every training process reads this module)

    # pruner=none still reports each epoch (the study's intermediate values), and never prunes.
    _, trial = link.open(instantiate(node) if node is not None else optuna.pruners.NopPruner())
    return TrialReporter(trial, goals.chosen.name, link.first_step)

"""Pruning in a grid sweep (`-m optimizer.lr=0.01,0.001 pruner=median` on Hydra's basic sweeper, any launcher): the
Optuna study its jobs report to, so that a job's pruner compares its epochs with the jobs already reported.

The sweep callback creates the study in the sweep directory's journal file (as an Optuna sweep's default
storage, runner.sweeps.study.study) before any job starts. Each job then holds one trial of it (JobTrial): asked when
the job starts training, tagged with its job number and sweep directory, reported to by the job's training
process after each epoch (the same TrialLink and listener as an Optuna sweep's trial), and told by the job
when its training ends: COMPLETE with its objective, PRUNED, or FAIL.

A re-run of the same sweep does not count a job twice: a job whose child run FINISHED (pruned ones too) is
skipped and keeps its COMPLETE or PRUNED trial; a job killed mid-training left its trial RUNNING, and the re-run
continues that trial (its reported epochs stay, the resumed ones are added); a job that failed had its trial
told FAIL, which no pruner reads, and the re-run asks a new trial for it. So the study holds exactly one
COMPLETE or PRUNED trial per finished job, and a FAIL trial per failed attempt.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from runner.sweeps.study.study import SWEEP_DIR_ATTR, TrialLink, end_trial, open_storage
from runner.sweeps.terms import JOURNAL_FILE

if TYPE_CHECKING:
    from runner.sweeps.sweep_config import SweepConfig

log = logging.getLogger("runner")

# The study of a grid sweep's jobs, in <sweep dir>/optuna_study.journal.
GRID_STUDY = "grid"
# On a grid sweep's trial: the Hydra job number it belongs to.
JOB_NUMBER_ATTR = "job_number"


def grid_storage(sweep_dir: str) -> str:
    return os.path.join(os.path.abspath(sweep_dir), JOURNAL_FILE)


def create_grid_study(config: SweepConfig, sweep_dir: str) -> None:
    """Before any job starts (the sweep callback): the study, created once; a re-run of the sweep finds it. Its
    direction follows sweep.objective (losses are minimized)."""
    import optuna  # noqa: PLC0415  Optuna: only in the processes of an Optuna or pruned sweep

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    minimize = config.lower_is_better
    optuna.create_study(
        study_name=GRID_STUDY,
        storage=open_storage(grid_storage(sweep_dir)),
        direction="minimize" if minimize else "maximize",
        load_if_exists=True,
    )


class JobTrial:
    """One grid-sweep job's trial: opened (or continued) when the job trains, told when its training ends."""

    def __init__(self, sweep_dir: str, number: int):
        self.sweep_dir, self.number = os.path.abspath(sweep_dir), number
        self.link: TrialLink | None = None

    def open(self) -> TrialLink:
        """The job's RUNNING trial left by an earlier attempt that was killed, else a new one."""
        import optuna  # noqa: PLC0415  Optuna: only in the processes of an Optuna or pruned sweep
        from optuna.trial import TrialState  # noqa: PLC0415  Optuna: only in the processes of an Optuna or pruned sweep

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = grid_storage(self.sweep_dir)
        # The sampler is never asked for a value (the grid's values are the job's overrides): the cheapest one.
        study = optuna.load_study(
            study_name=GRID_STUDY, storage=open_storage(storage), sampler=optuna.samplers.RandomSampler()
        )
        left_running = [
            trial
            for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if trial.user_attrs.get(JOB_NUMBER_ATTR) == self.number
            and trial.user_attrs.get(SWEEP_DIR_ATTR) == self.sweep_dir
        ]
        if left_running:
            number = left_running[0].number
            log.info("job %d continues its trial %d of the grid study", self.number, number)
        else:
            trial = study.ask()
            trial.set_user_attr(JOB_NUMBER_ATTR, self.number)
            trial.set_user_attr(SWEEP_DIR_ATTR, self.sweep_dir)
            number = trial.number
        self.link = TrialLink(storage, GRID_STUDY, number)
        return self.link

    def tell(self, value: float | None) -> None:
        """The training ended: PRUNED if its pruner stopped it, else COMPLETE with `value`, or FAIL (value None)."""
        if self.link is None:
            return
        study, trial = self.link.open()
        end_trial(study, trial, value)

"""A sweep's start and end, as the sweep's Hydra Callback (runner.sweeps.callback) calls them.

`start_sweep` checks everything the sweep asks before anything exists (its rules, its points, its pruner and
study, its tracking server, its launcher, its folds), then creates the tracking database, the experiment and one
parent run before any job starts (runner.sweeps.plugins.parent_run), so jobs running in parallel
(hydra/launcher=joblib) only ever add child runs: no race on the database schema, the experiment or the parent.
Re-running the same `hydra.sweep.dir` reuses that parent. `end_sweep` lets the warm workers' runs end, then
summarizes the parent's children, registers the best job's model, closes the parent, and makes the command fail,
naming the failed jobs, if any job failed.

MLflow reads its logging level when it is imported, so runner.sweeps.plugins.parent_run (MLflow's side) is imported
only once the sweep's verbosity is set (runner.verbosity.configure).
"""

from __future__ import annotations

import dataclasses
import logging
import sys

from omegaconf import DictConfig, OmegaConf

from runner.config.check import check_sweep_points
from runner.config.schema import OptunaSweeperSettings
from runner.config.settings import sweep_settings
from runner.errors import RunnerError, report
from runner.lifeline import Process, lifeline
from runner.sweeps.job.folds import check_folds
from runner.sweeps.launch.launchers import check_before_sweep, launcher_of
from runner.sweeps.launch.warm_pool import POOL, worker_kind
from runner.sweeps.study.grid_study import create_grid_study
from runner.sweeps.study.pruning import check_sweep
from runner.sweeps.study.study import open_storage
from runner.sweeps.sweep_config import SweepConfig, sweep_dir_of
from runner.sweeps.terms import HYDRAS_OPTUNA_SWEEPER, SWEEPER_TARGET, run_name_for
from runner.tracking.server_access import check_server
from runner.verbosity import configure, is_verbose, loading_tensorflow

log = logging.getLogger("runner")


def start_sweep(config: DictConfig) -> None:
    """Check the sweep, then create (or reuse) its parent run; a bad sweep is one paragraph and exit 2, leaving
    nothing behind."""
    try:
        refuse_hydras_optuna_sweeper(config)
        sweep_settings(config)
        check_sweep_points(config)
        # Before the parent run exists: a sweep that cannot start, or a server that is down or refuses
        # this user, leaves nothing behind.
        sweep = SweepConfig.read(config)  # also refuses an empty experiment name, a bad model name, ...
        check_optuna_sweep(config, sweep)
        check_server(sweep.tracking, registers=sweep.tracking.log_model)
        check_before_sweep(config, sweep.sweep.trial_models)
        verbose = is_verbose(config.get("verbose"), config.hydra.verbose)
        configure(verbose)  # before MLflow is imported
        with loading_tensorflow(verbose):
            check_folds(config)  # loads the data (and TensorFlow) with sweep.folds alone
        if sweep.prunes_a_grid:
            # The study the grid's jobs report their epochs to, before any job starts.
            create_grid_study(sweep, sweep_dir_of(config))
        started_a_worker = _start_first_worker(config, sweep)
        from runner.sweeps.plugins import parent_run  # noqa: PLC0415  MLflow: imported after configure(verbose)

        parent_id = parent_run.start_parent_run(config, sweep)
    except RunnerError as error:
        POOL.close()
        _exit_with(error, 2)
    if started_a_worker:  # the first run waits for it to import TensorFlow: time for what the sweep's end needs
        parent_run.load_ahead()
    log.info(
        "sweep %s: MLflow parent run %s; MLflow UI: %s",
        run_name_for(sweep_dir_of(config)),
        parent_id,
        parent_run.parent_ui_link(sweep, parent_id),
    )


def end_sweep(config: DictConfig) -> None:
    """The warm workers of this process (the basic launcher's): the runs still ending finish first, so that the
    summary and the registry read every run FINISHED with its model; an idle one logs the champion's model where
    the sweep leaves that to its end (runner.sweeps.job.champion). Then the parent run's summary and registry."""
    from runner.sweeps.plugins import parent_run  # noqa: PLC0415  MLflow: imported after configure(verbose)

    try:
        try:
            sweep = SweepConfig.read(config)
            POOL.settle(sweep.sweep.worker_memory_mb)
            parent_run.finish_parent_run(config, sweep)
        finally:
            POOL.close()
    except RunnerError as error:
        _exit_with(error, 1)


def _exit_with(error: RunnerError, code: int) -> None:
    # A callback's exceptions only become warnings in Hydra; SystemExit is what stops the command.
    report("error", error)
    sys.exit(code)


def _start_first_worker(config: DictConfig, sweep: SweepConfig) -> bool:
    """Where the sweep's jobs run in this process and train in warm workers (runner.sweeps.launch.warm_pool), the
    first worker starts importing now, beside the parent run's and the study's creation; whether it did."""
    launcher = launcher_of(str(OmegaConf.select(config, "hydra.launcher._target_") or ""))
    if launcher is None or not launcher.jobs_in_the_sweeps_process or worker_kind(sweep) is None:
        return False
    POOL.start_ahead(lifeline([Process.this()]))
    return True


def refuse_hydras_optuna_sweeper(config: DictConfig) -> None:
    """A config written for hydra-optuna-sweeper names that sweeper's class: the runner's sweeper replaces it (it
    records pruned trials, on a current Optuna) and takes the same keys, so the fix is to drop the line."""
    target = OmegaConf.select(config, "hydra.sweeper._target_")
    if target == HYDRAS_OPTUNA_SWEEPER:
        raise RunnerError(
            f"hydra.sweeper._target_={target} is Hydra's Optuna sweeper, which the runner replaces with its own "
            f"({SWEEPER_TARGET}: ask/tell over the launcher, pruned trials recorded, on the Optuna this project pins). "
            "Fix: drop the `_target_` line from the config's hydra.sweeper node and keep `override /hydra/sweeper: "
            f"optuna` in its defaults (or pass hparams_search=optuna): the runner's sweeper takes Hydra's sweeper's "
            f"keys (its own: {', '.join(item.name for item in dataclasses.fields(OptunaSweeperSettings))}).",
            key="hydra.sweeper._target_",
        )


def check_optuna_sweep(config: DictConfig, sweep: SweepConfig) -> None:
    """The sweep's rules and its pruner (runner.sweeps.study.pruning.check_sweep) and, for an Optuna sweep, its
    search space and queued trials, and a study storage that opens."""

    check_sweep(config, sweep)
    if sweep.study is not None:
        from runner.sweeps.plugins.optuna_sweeper import check_settings  # noqa: PLC0415  Optuna: only for an Optuna sweep

        check_settings(config, sweep)
        open_storage(sweep.study.storage)

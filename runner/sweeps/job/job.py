"""One job of a sweep (`python -m runner -m ...`): its MLflow child run, and its training in a fresh process.

TensorFlow's logical-device split and distribution strategies are process-wide, so a sweep job never
trains in the sweep's process: it runs `python -m runner <its overrides>` with the job directory as run
directory and reads how it ended, the objective included, from the outcome.json that process writes
(runner.outcome). With `sweep.seeds=N` a job trains N seeds, one child run, process and sub-directory
(`seed-<seed>/`) each, and returns the mean of their objectives; with `sweep.folds=K`, each seed K times, one
child run per fold (`fold-<k>/`). By default a job holds out a validation split and answers with its val_accuracy
(validation_of_job). The child run is created here, before that
process starts, so a job that fails before reaching MLflow (a config error) is still recorded as FAILED under
the sweep's parent run.

A job never raises for a failed training: Hydra's sweepers abort the whole sweep at the first job that
raises (hydra issues #1407, #2824). It returns the worst possible objective instead; a job whose
launcher lost it (a SLURM job killed before it returned) is recorded the same way by record_lost_job.

The child run is tagged with where the job ran (launcher, slurm_job_id). In a job of several SLURM tasks
(hydra.launcher.tasks_per_node > 1, a cluster=slurm training) every task runs this function: task 0
records the job, the others only train beside it.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from hydra.core.override_parser.overrides_parser import OverridesParser
from mlflow.entities import Run, RunStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from omegaconf import DictConfig, OmegaConf

from runner import outcome
from runner.config.schema import SWEEP_VALIDATION_FRACTION, Settings
from runner.data.validation import OPTIONAL_VARIABLE
from runner.errors import RunnerError
from runner.lifeline import Process, exit_once_gone, lifeline, sweep_process
from runner.outcome import (
    FINISHED,
    KILLED,
    MODEL_AT_SWEEP_END_VARIABLE,
    OUTCOME_FILE,
    OUTCOME_VARIABLE,
    SWEEP_DIR_VARIABLE,
)
from runner.overrides import quoted
from runner.run_lock import describe, wait_while_held
from runner.searchpath import searchpath_overrides
from runner.sweeps.job.run_command import RunCommand
from runner.sweeps.launch.launchers import LAUNCHERS, launcher_name
from runner.sweeps.launch.ray_worker import ray_node_tags
from runner.sweeps.launch.warm_pool import POOL, worker_kind
from runner.sweeps.study.grid_study import JobTrial
from runner.sweeps.study.pruning import report_replicate
from runner.sweeps.study.study import PRUNED_TAG, REPLICATES_ATTR, TrialLink
from runner.sweeps.sweep_config import SweepConfig
from runner.sweeps.terms import (
    CHOSEN_BY_TAG,
    CONFIGURATION_TAG,
    FOLD_KEY,
    FOLD_TAG,
    JOB_NUMBER_TAG,
    LAUNCHER_TAG,
    OVERRIDES_TAG,
    RUN_DIR_TAG,
    SEED_KEY,
    SEED_TAG,
    SLURM_JOB_ID_TAG,
    SWEPT_KEYS_TAG,
    WALL_SECONDS,
    read_parent_run_id,
)
from runner.tracking.lifecycle import ERROR_TAG
from runner.tracking.run_id_file import RUN_ID_FILE, write_run_id
from runner.tracking.run_writer import end_failed
from runner.training.progress import bar_enabled

log = logging.getLogger("runner")

_FINISHED = RunStatus.to_string(RunStatus.FINISHED)
# How long an interrupted job's training process may take to save and mark its run (submitit signals a
# time-out hydra.launcher.signal_delay_s, 120 s by default, before SLURM's time limit).
STOP_GRACE_SECONDS = 60.0
SCHEMA_SEED = Settings.seed  # the schema's default seed
# A run's fresh training process is this command and the run's arguments (_Job._arguments); a warm worker gets those.
RUNNER_COMMAND = (sys.executable, "-m", "runner")


def run_sweep_job(cfg: DictConfig, hydra_config: DictConfig) -> float | list[float]:
    """Train this job (each of its seeds, with sweep.seeds > 1) in a subprocess under the sweep's parent
    run; return its objective (the mean over its seeds), or one mean per objective in a sweep over several."""
    config = SweepConfig.read(cfg, hydra_config)  # what this job reads of its config, once
    sweep_dir = os.path.abspath(str(hydra_config.sweep.dir))
    job_dir = str(hydra_config.runtime.output_dir)
    number = int(hydra_config.job.num)
    overrides = [str(item) for item in hydra_config.overrides.task]

    client = MlflowClient(tracking_uri=config.tracking_uri)
    parent = _parent_run(client, sweep_dir)
    swept = parent.data.tags.get(SWEPT_KEYS_TAG, "")
    name = _point_name(overrides, swept, number)
    configuration = configuration_name(overrides, swept, number)
    job = _Job(client, parent, number, configuration, config, hydra_config, progress_overrides(config.job.progress))
    job.validation = validation_of_job(config, swept)
    # A grid sweep with a pruner: the job's training reports to a trial of its own.
    if config.prunes_a_grid:
        job.grid_trial = JobTrial(sweep_dir, number)
    seeds = config.seeds
    folds = config.sweep.folds
    runs = _runs(job_dir, overrides, name, configuration, seeds, folds)
    values = []
    for index, run in enumerate(runs):
        # A trial's runs continue one another's steps (TrialLink.first_step): the pruner compares like with like.
        values.append(job.train_seed(*run, first_step=index * config.job.epochs))
        if job.pruned_at is not None or job.replicate_pruned(index, values[-1]):
            break  # the pruner stopped the trial: its other seeds and folds do not train
        if job.interrupted:  # the rest is the re-run's
            return config.worst_answer
    mean = statistics.fmean(values)  # a failed seed's (or fold's) worst value makes the whole point the worst
    job.tell_grid_trial(mean)
    job.record_replicates(values)
    if len(runs) > 1:
        log.info(
            "job %d (%s): %s %s over seeds %s%s, mean %.4f",
            number,
            configuration,
            config.objective,
            ", ".join(f"{value:.4f}" for value in values),
            ", ".join(map(str, seeds)),
            f" and {folds} folds" if folds else "",
            mean,
        )
    return job.answer(mean)


def _runs(
    job_dir: str, overrides: list[str], name: str, configuration: str, seeds: list[int], folds: int | None
) -> list[tuple[int, str, list[str], str, tuple[int, int] | None]]:
    """The job's runs, in the order it trains them: (seed, run directory, overrides, run name, (fold, folds)). One
    seed without folds is one run in the job's own directory, as without sweep.seeds; each seed of several trains
    in `seed-<seed>/`, and with sweep.folds each fold in `fold-<k>/` below (a re-run trains only the unfinished)."""
    if len(seeds) == 1 and folds is None:
        return [(seeds[0], job_dir, overrides, name, None)]
    runs: list[tuple[int, str, list[str], str, tuple[int, int] | None]] = []
    for seed in seeds:
        seed_dir, seed_overrides, seed_name = job_dir, overrides, name
        if len(seeds) > 1:
            seed_dir = os.path.join(job_dir, f"seed-{seed}")
            seed_overrides, seed_name = with_seed(overrides, seed), f"{configuration},{SEED_KEY}={seed}"
        if folds is None:
            runs.append((seed, seed_dir, seed_overrides, seed_name, None))
            continue
        for fold in range(folds):
            fold_dir, fold_name = os.path.join(seed_dir, f"fold-{fold}"), f"{seed_name},{FOLD_KEY}={fold}"
            runs.append((seed, fold_dir, seed_overrides, fold_name, (fold, folds)))
    return runs


def progress_overrides(progress, stderr=None) -> list[str]:
    """What the training process is told about its progress bar. It writes to this job's stderr: with
    `progress=null` (only on a terminal) the bar is drawn when this job's stderr, the sweep's, is a terminal (the
    basic launcher's jobs in a terminal), never in a log file (submitit, Ray)."""
    return ["progress=true"] if progress is None and bar_enabled(None, stderr) else []


def with_seed(overrides: list[str], seed: int) -> list[str]:
    """The job's overrides with `seed=<seed>` in place of any seed it had."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    kept = [text for text, override in zip(overrides, parsed, strict=True) if override.key_or_group != SEED_KEY]
    return [*kept, f"{SEED_KEY}={seed}"]


def configuration_name(overrides: list[str], swept_keys: str, number: int) -> str:
    """What the job's runs share with the runs of other seeds: its point's name without `seed`."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    without_seed = [text for text, override in zip(overrides, parsed, strict=True) if override.key_or_group != SEED_KEY]
    return _point_name(without_seed, ",".join(key for key in swept_keys.split(",") if key != SEED_KEY), number)


class _Job:
    """One Hydra job's share of the sweep: a child run per seed, each trained by its own process."""

    def __init__(
        self,
        client: MlflowClient,
        parent: Run,
        number: int,
        configuration: str,
        config: SweepConfig,
        hydra_config: DictConfig,
        progress: list[str],
    ):
        self.client, self.parent, self.number = client, parent, number
        self.progress = progress  # progress_overrides
        self.config, self.configuration = config, configuration
        self.objective, self.worst = config.objective, config.worst
        self.hydra_config = hydra_config
        self.cwd = str(hydra_config.runtime.cwd)
        self.validation = ValidationOfJob()  # the validation split it chooses on (validation_of_job)
        self.trial = trial_link(config, hydra_config)  # an Optuna sweep's trial, which the training process reports to
        self.grid_trial: JobTrial | None = None  # a pruned grid sweep's: asked and told by this job
        self.pruned_at: int | None = None  # the epoch at which the pruner stopped one of the job's runs
        self.failed = False  # one of its runs failed
        self.interrupted = False  # one of its runs was stopped, resumable: a re-run of the sweep continues it
        self.link: TrialLink | None = None  # the trial its last trained run reported to
        self.run_ids: list[str] = []  # its runs so far, trained or found FINISHED
        self.finished_metrics: list[Mapping[str, float]] = []  # the final numbers of each of its runs that finished
        launcher = where_it_runs(hydra_config)[LAUNCHER_TAG]
        self.lifeline = lifeline_of(launcher)
        # The warm workers its runs train in (runner.sweeps.launch.warm_pool), or None: a fresh process each.
        warm = launcher in LAUNCHERS and LAUNCHERS[launcher].keeps_warm_workers
        self.worker_kind = worker_kind(config) if warm else None

    def train_seed(
        self,
        seed: int,
        run_dir: str,
        overrides: list[str],
        name: str,
        fold: tuple[int, int] | None = None,
        first_step: int = 0,
    ) -> float:
        """Train one seed in run_dir under its own child run (skipped if that run already FINISHED); `fold`:
        (k, K), fold k of K held out as the validation split (sweep.folds); `first_step`: the trial's step before
        this run's epoch 1."""
        label = f"job {self.number} ({name})"
        os.makedirs(run_dir, exist_ok=True)
        wait_for_holder(run_dir, label)
        run = _existing_child(self.client, run_dir, self.parent.info.run_id, ",".join(overrides))
        if run is not None and run.info.status == _FINISHED:
            return self._finished_before(run, label)
        arguments = self._arguments(run_dir, overrides, fold)
        rank = other_task_rank()
        if rank is not None:
            # Another task of a job of several (hydra.launcher.tasks_per_node=2 with cluster=slurm): it trains
            # beside the chief, task 0, which alone records the job and returns its result.
            log.info("%s: task %d trains beside task 0, which records the job", label, rank)
            outcome_file = os.path.join(run_dir, f"outcome-task-{rank}.json")
            train_in_process([*RUNNER_COMMAND, *arguments], cwd=self.cwd, outcome_file=outcome_file)
            return float("nan")
        tags = {
            CONFIGURATION_TAG: self.configuration,
            RUN_DIR_TAG: run_dir,
            SEED_TAG: str(seed),
            **({FOLD_TAG: str(fold[0])} if fold else {}),
        }
        run_id = self._child_run(run, name, ",".join(overrides), tags, label)
        # The training process continues the run this file names instead of creating its own.
        write_run_id(run_dir, run_id)
        link = self.trial or (self.grid_trial.open() if self.grid_trial else None)
        self.link = replace(link, first_step=first_step) if link is not None else None
        self.run_ids.append(run_id)
        # How the sweep continues the run at its end (its champion's model): without the trial it reported to.
        RunCommand(arguments, self.cwd, dict(self.validation.environ)).write(run_dir)
        environ = {
            **self.validation.environ,
            **(self.link.to_environment() if self.link else {}),
            **({MODEL_AT_SWEEP_END_VARIABLE: "1"} if self.config.sweep.trial_models == "champion" else {}),
            SWEEP_DIR_VARIABLE: os.path.abspath(str(self.hydra_config.sweep.dir)),
        }
        outcome_file = os.path.join(run_dir, OUTCOME_FILE)
        started = time.monotonic()
        returncode = self._train(arguments, outcome_file, environ)
        self.client.log_metric(run_id, WALL_SECONDS, time.monotonic() - started)
        return self._ended(outcome.read(outcome_file, returncode, who="the training process"), run_id, label)

    def _train(self, arguments: list[str], outcome_file: str, environ: dict[str, str]) -> int:
        """Train one run of `python -m runner <arguments>`: in a warm worker of the pool where its kind allows
        (runner.sweeps.launch.warm_pool), else in a fresh process; its exit status."""
        if self.worker_kind is None:
            command = [*RUNNER_COMMAND, *arguments]
            return train_in_process(
                command, cwd=self.cwd, outcome_file=outcome_file, environ={**environ, **self.lifeline}
            )
        outcome.forget(outcome_file)
        environ = {**environ, OUTCOME_VARIABLE: outcome_file}
        limit = self.config.sweep.worker_memory_mb
        return POOL.train(self.worker_kind, arguments, self.cwd, environ, self.lifeline, limit)

    def _finished_before(self, run: Run, label: str) -> float:
        """A run an earlier attempt finished: not trained again; its objective as it was chosen."""
        self.run_ids.append(run.info.run_id)
        log.info("%s already FINISHED as MLflow run %s: skipped", label, run.info.run_id)
        if PRUNED_TAG in run.data.tags:  # and its trial's other runs stay untrained
            self.pruned_at = int(run.data.tags[PRUNED_TAG])
        chosen_by = self.validation.chosen_by(self.objective, run.data.metrics)
        if chosen_by:
            self.finished_metrics.append(run.data.metrics)
        return float(run.data.metrics[chosen_by]) if chosen_by else self.worst

    def answer(self, mean: float) -> float | list[float]:
        """What the job returns to its sweeper: the mean of its objective over its runs (`mean`); in a sweep over
        several objectives, the mean of each, in sweep.objective's order (the worst of each where a run failed).
        With sweep.constraints, an Optuna trial is told how far the means are past each bound (set_constraint:
        zero or less where it holds), so that its sampler learns where the feasible configurations are."""
        goals = self.config.goals
        if not goals.several and not goals.constraints:
            return mean
        whole = not self.failed and bool(self.finished_metrics)
        means = {key: self._mean(key) if whole else math.nan for key in (*goals.names, *goals.constrained_metrics)}
        if self.trial is not None and goals.constraints and whole and self.pruned_at is None:
            _, trial = self.trial.open()
            for constraint in goals.constraints:
                value = means[constraint.metric]
                trial.set_constraint(str(constraint), math.inf if math.isnan(value) else constraint.violation(value))
        if not goals.several:
            return mean
        if not whole:
            return self.config.worst_answer
        return [means[goal.name] if math.isfinite(means[goal.name]) else goal.worst for goal in goals.each]

    def _mean(self, key: str) -> float:
        """The mean of `key` over the job's finished runs; NaN where one of them lacks it."""
        values = [metrics.get(key) for metrics in self.finished_metrics]
        return statistics.fmean(values) if all(value is not None for value in values) else math.nan  # type: ignore[arg-type]

    def _arguments(self, run_dir: str, overrides: list[str], fold: tuple[int, int] | None) -> list[str]:
        """What follows `python -m runner` for a run: the job's overrides, in run_dir."""
        return [
            *searchpath_overrides(self.hydra_config),
            *overrides,
            *self.validation.overrides,
            *((f"dataset.folds={fold[1]}", f"dataset.fold={fold[0]}") if fold else ()),
            f"hydra.run.dir={quoted(run_dir)}",
            # A run, even if the config sets hydra.mode=MULTIRUN (hparams_search does); and the job
            # directory's .hydra/ stays the one the sweep wrote.
            "hydra.mode=RUN",
            "hydra.output_subdir=null",
            # The sweep registers its best job's model when it ends; a job never registers its own.
            "mlflow.register=false",
            *self.progress,
        ]

    def _child_run(self, run: Run | None, name: str, overrides_tag: str, tags: dict[str, str], label: str) -> str:
        """The run's child run: the one an interrupted or failed attempt left, running again, or a new one."""
        where = where_it_runs(self.hydra_config)
        if run is None:
            run_id = _new_child(self.client, self.parent, name, self.number, overrides_tag, {**where, **tags})
            log.info("%s: MLflow run %s", label, run_id)
            return run_id
        run_id = run.info.run_id
        # Re-attach (the job was interrupted or failed before): clear what the last attempt left.
        if ERROR_TAG in run.data.tags:
            self.client.delete_tag(run_id, ERROR_TAG)
        for key, value in where.items():
            self.client.set_tag(run_id, key, value)
        self.client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        log.info("%s: continuing MLflow run %s", label, run_id)
        return run_id

    def _ended(self, ended: outcome.Outcome, run_id: str, label: str) -> float:
        """How the training process ended, for the job: its objective; or, stopped resumable, the run left KILLED
        for a re-run; or the run ended FAILED with its error. The last two answer with the worst value."""
        chosen_by = self.validation.chosen_by(self.objective, ended.metrics)
        if ended.status == FINISHED and chosen_by:
            self.finished_metrics.append(ended.metrics)
            self.client.set_tag(run_id, CHOSEN_BY_TAG, chosen_by)
            if self.link is not None:
                self._tag_if_pruned(self.link, run_id, label)
            return float(ended.metrics[chosen_by])
        if ended.status == KILLED and ended.resumable:
            # Stopped as on preemption (its sweep is gone: runner.lifeline): its run stays KILLED and resumable, and
            # a re-run of the sweep continues it (its trial left as it is).
            self.interrupted = True
            log.warning("%s stopped, resumable (MLflow run %s is KILLED): %s", label, run_id, ended.message)
            return self.worst
        error = ended.message or f"the training process ended {ended.status} without its {self.objective}"
        # A process that failed during training already ended its run FAILED with its own error.
        end_failed(self.client, run_id, error, keep_own_error=True)
        self.failed = True
        log.error("%s failed (MLflow run %s): %s", label, run_id, error)
        return self.worst

    def replicate_pruned(self, replicate: int, value: float) -> bool:
        """With a replicate pruner (pruner=wilcoxon), after the job's run of `replicate`: its objective goes to the
        trial and the pruner decides; a pruned trial's runs are tagged `pruned_at_epoch` (their last epoch), so that
        the summary shows the configuration pruned and never compares or picks it."""
        if self.link is None or self.failed or not self.config.prunes_replicates:
            return False
        if not report_replicate(self.link, self.config, replicate, value):
            return False
        self.pruned_at = self.config.job.epochs
        for run_id in self.run_ids:
            self.client.set_tag(run_id, PRUNED_TAG, str(self.pruned_at))
        return True

    def record_replicates(self, values: list[float]) -> None:
        """An Optuna trial of several seeds or folds keeps each one's objective (REPLICATES_ATTR), from which the
        study's terminator measures the noise between replicates (runner.sweeps.study.terminator)."""
        if self.trial is not None and len(values) > 1 and not self.failed:
            _, trial = self.trial.open()
            trial.set_user_attr(REPLICATES_ATTR, values)

    def tell_grid_trial(self, mean: float) -> None:
        """A pruned grid sweep's trial, once the job's runs have ended: PRUNED, FAIL if a run failed, else its mean."""
        if self.grid_trial is not None:
            self.grid_trial.tell(None if self.failed else mean)

    def _tag_if_pruned(self, link: TrialLink, run_id: str, label: str) -> None:
        """A trial that its pruner stopped: its run gets the tag `pruned_at_epoch` (the trial holds it)."""
        _, trial = link.open()
        epoch = trial.user_attrs.get(PRUNED_TAG)
        if epoch is not None:
            self.pruned_at = int(epoch)
            self.client.set_tag(run_id, PRUNED_TAG, str(epoch))
            log.info("%s pruned at epoch %s (MLflow run %s)", label, epoch, run_id)


# ---- the validation split a sweep chooses on (runner.data.validation) ----
@dataclass(frozen=True)
class ValidationOfJob:
    """What a job adds to its training command for the validation split the sweep chooses on, and which metric
    its training's outcome answers with."""

    overrides: tuple[str, ...] = ()
    environ: dict[str, str] = field(default_factory=dict)
    fallback: str | None = None  # the metric answered with where the objective's is missing (data not split)

    def chosen_by(self, objective: str, metrics) -> str | None:
        if objective in metrics:
            return objective
        return self.fallback if self.fallback is not None and self.fallback in metrics else None


def validation_of_job(config: SweepConfig, swept: str) -> ValidationOfJob:
    """With a val_ objective (or constraint) and no dataset.validation_fraction, the job holds out the default
    fraction; left to the default objective, data the runner cannot split trains without one and answers with the
    test set's metric (the summary says so). The split seed is the job's seed before its replicates (sweep.seeds), or
    the schema's seed when the sweep varies `seed` itself, so every configuration and seed is validated on the same
    examples."""
    fraction = config.job.validation_fraction
    overrides, environ = [], {}
    folds = config.sweep.folds  # then each run holds out its fold instead (train_seed)
    fallback = config.fallback_objective if config.objective_is_default and folds is None else None
    validated = (*config.goals.names, *config.goals.constrained_metrics)  # every objective, every constraint
    if fraction is None and folds is None and any(name.startswith("val_") for name in validated):
        overrides.append(f"dataset.validation_fraction={SWEEP_VALIDATION_FRACTION}")
        fraction = SWEEP_VALIDATION_FRACTION
        if fallback is not None:
            environ[OPTIONAL_VARIABLE] = "1"
    if (fraction is not None or folds is not None) and config.job.split_seed is None:
        seed = SCHEMA_SEED if SEED_KEY in swept.split(",") else config.job.seed
        overrides.append(f"dataset.split_seed={seed}")
    return ValidationOfJob(tuple(overrides), environ, fallback)


def slurm_job_id(environ=os.environ) -> str | None:
    """The id SLURM shows for the job this process runs in (`12_3` for task 3 of array job 12), or None."""
    array_job, array_task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return environ.get("SLURM_JOB_ID") or None


def other_task_rank(environ=os.environ) -> int | None:
    """This process's rank if it is a task other than task 0 of a SLURM job step of several tasks."""
    tasks, rank = environ.get("SLURM_STEP_NUM_TASKS", "1"), environ.get("SLURM_PROCID", "0")
    if tasks.isdigit() and int(tasks) > 1 and rank.isdigit() and int(rank) > 0:
        return int(rank)
    return None


def where_it_runs(hydra_config: DictConfig) -> dict[str, str]:
    """The child run's tags saying where the job ran: its launcher and, under SLURM, its SLURM job id, on a Ray
    worker, its Ray node id."""
    tags = {LAUNCHER_TAG: launcher_name(str(OmegaConf.select(hydra_config, "launcher._target_") or ""))}
    job_id = slurm_job_id()
    if job_id:
        tags[SLURM_JOB_ID_TAG] = job_id
    tags.update(ray_node_tags())
    return tags


def record_lost_job(cfg: DictConfig, job_dir: str, error: str, slurm_job: str | None) -> float | list[float]:
    """A job that ended without returning (its launcher's job was killed: a time limit, scancel, a node
    failure): mark its child run FAILED with `error`, creating the run if the job never got to; return
    the worst objective, for the sweeper. `cfg` is the job's config, hydra node included."""
    hydra_config = cfg.hydra
    config = SweepConfig.read(cfg)
    objective, worst = config.objective, config.worst_answer
    number = int(hydra_config.job.num)
    overrides = [str(item) for item in hydra_config.overrides.task]
    overrides_tag = ",".join(overrides)
    client = MlflowClient(tracking_uri=config.tracking_uri)
    parent = _parent_run(client, os.path.abspath(str(hydra_config.sweep.dir)))
    run = _existing_child(client, job_dir, parent.info.run_id, overrides_tag)
    if run is not None and run.info.status == _FINISHED:  # it finished; only its answer was lost
        if config.goals.several:
            metrics = run.data.metrics
            return [float(metrics[goal.name]) if goal.name in metrics else goal.worst for goal in config.goals.each]
        chosen_by = validation_of_job(config, "").chosen_by(objective, run.data.metrics)
        return float(run.data.metrics[chosen_by]) if chosen_by else config.worst
    where = where_it_runs(hydra_config)
    if slurm_job:
        where[SLURM_JOB_ID_TAG] = slurm_job
    if run is None:
        name = _point_name(overrides, parent.data.tags.get(SWEPT_KEYS_TAG, ""), number)
        run_id = _new_child(client, parent, name, number, overrides_tag, where)
        os.makedirs(job_dir, exist_ok=True)
        write_run_id(job_dir, run_id)  # a re-run of the sweep continues this run
    else:
        run_id = run.info.run_id
    end_failed(client, run_id, error)  # the job was killed: that is what the run must say
    log.error("job %d failed (MLflow run %s): %s", number, run_id, error)
    return worst


def _new_child(
    client: MlflowClient, parent: Run, name: str, number: int, overrides_tag: str, where: dict[str, str]
) -> str:
    return client.create_run(
        parent.info.experiment_id,
        run_name=name,
        tags={
            MLFLOW_PARENT_RUN_ID: parent.info.run_id,
            JOB_NUMBER_TAG: str(number),
            OVERRIDES_TAG: overrides_tag,
            **where,
        },
    ).info.run_id


def _parent_run(client: MlflowClient, sweep_dir: str) -> Run:
    parent_id = read_parent_run_id(sweep_dir)
    if parent_id is None:
        raise RunnerError(
            f"hydra.sweep.dir={sweep_dir!r} holds no MLflow parent run id: the sweep callback did not run. "
            "Fix: keep `hydra.callbacks.sweep` (runner.sweeps.callback.SweepCallback) in conf/config.yaml, or pass it "
            "again if a config or override removed it."
        )
    return client.get_run(parent_id)


def _existing_child(client: MlflowClient, job_dir: str, parent_id: str, overrides_tag: str) -> Run | None:
    """The child run this job directory already has from an earlier run of the same sweep and the
    same overrides, or None (then the job starts a new child run)."""
    path = os.path.join(job_dir, RUN_ID_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        run_id = handle.read().strip()
    try:
        run = client.get_run(run_id)
    except MlflowException:  # an id from another tracking store
        return None
    same_job = (
        run.info.lifecycle_stage == "active"
        and run.data.tags.get(MLFLOW_PARENT_RUN_ID) == parent_id
        and run.data.tags.get(OVERRIDES_TAG) == overrides_tag
    )
    return run if same_job else None


def _point_name(overrides: list[str], swept_keys: str, number: int) -> str:
    """The job's values of the keys the sweep varies (`batch=64,lr_scaling=linear`): its run name."""
    keys = set(filter(None, swept_keys.split(",")))
    parsed = OverridesParser.create().parse_overrides(overrides)
    swept = [text for text, override in zip(overrides, parsed, strict=True) if override.key_or_group in keys]
    return ",".join(swept or overrides) or f"job {number}"


def trial_link(config: SweepConfig, hydra_config: DictConfig) -> TrialLink | None:
    """The Optuna trial this job is (runner.sweeps.plugins.optuna_sweeper launches trial N as job N), or None."""
    study = config.study
    if study is None:
        return None
    return TrialLink(study.storage, study.name, int(hydra_config.job.num))


def lifeline_of(launcher: str) -> dict[str, str]:
    """What a job's training process watches (runner.lifeline): this job's process, always on the training's
    machine, and the sweep's where the launcher runs the job on the sweep's machine (under SLURM and Ray the
    engine owns the job: it ends the job's process when it stops the job)."""
    watched = [Process.this()]
    sweep = sweep_process()
    on_the_sweeps_machine = launcher in LAUNCHERS and LAUNCHERS[launcher].on_the_sweeps_machine
    if on_the_sweeps_machine and sweep is not None and sweep.pid != os.getpid():
        watched.append(sweep)
        if launcher == "joblib":  # this job runs in a loky worker, which would wait on for minutes
            exit_once_gone(sweep)
    return lifeline(watched)


def wait_for_holder(run_dir: str, label: str) -> None:
    """A training process of an earlier attempt (a killed sweep's, stopping) still holds the run directory: wait
    for it to end, saying so, then resume what it leaves, rather than failing the trial."""

    def waiting(pid: int | None) -> None:
        log.warning(
            "%s: %s still holds %s (a training process of an earlier attempt of this sweep): waiting for it to "
            "end, then continuing its run",
            label,
            describe(pid),
            run_dir,
        )

    if wait_while_held(run_dir, waiting):
        log.info("%s: the earlier training process ended; continuing", label)


def train_in_process(command: list[str], cwd: str, outcome_file: str, environ: dict[str, str] | None = None) -> int:
    """Run the training process, which writes how it ended to `outcome_file` (an earlier outcome there is
    removed first); return its exit status. Its stdout and stderr are this job's (progress bars included).

    If this job is interrupted meanwhile (submitit's handler of the time-out or preemption signal raises
    here, or Ctrl-C), the training process is stopped as preemption stops it, with SIGTERM: it saves a
    checkpoint and marks its run KILLED and resumable, so that a re-run of the sweep (or the requeued
    job) continues it. Then the interruption goes on. SLURM sends submitit's signal to every process of the
    job, so the training process starts with it blocked (a signal mask is inherited): its default action
    would kill the training before it could save."""
    outcome.forget(outcome_file)
    submitit_signal = _submitit_signal()
    signal.pthread_sigmask(signal.SIG_BLOCK, {submitit_signal})
    try:
        process = subprocess.Popen(
            command, cwd=cwd, env={**os.environ, **(environ or {}), OUTCOME_VARIABLE: outcome_file}
        )
    finally:  # a signal that came meanwhile is handled here, by submitit's handler
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {submitit_signal})
    try:
        return process.wait()
    except BaseException:
        _stop_for_resume(process)
        raise


def _submitit_signal() -> signal.Signals:
    """The signal submitit asks SLURM to send before a job's time limit (and on preemption): USR2 unless
    SUBMITIT_PREEMPT_SIGNAL names another."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper()
    return getattr(signal, name if name.startswith("SIG") else f"SIG{name}", signal.SIGUSR2)


def _stop_for_resume(process: subprocess.Popen) -> None:
    """SIGTERM the training process and give it STOP_GRACE_SECONDS to save and mark its run; then kill it."""
    if process.poll() is not None:
        return
    log.warning(
        "the sweep job was interrupted: stopping its training process (pid %d) with SIGTERM so that it "
        "saves a checkpoint and can be resumed",
        process.pid,
    )
    process.terminate()
    try:
        process.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()

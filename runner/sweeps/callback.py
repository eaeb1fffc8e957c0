"""A sweep's MLflow parent run, owned by a Hydra Callback configured in conf/config.yaml.

`on_multirun_start` creates the tracking database, the experiment and one parent run before any job
starts, so jobs running in parallel (hydra/launcher=joblib) only ever add child runs: no race on the
database schema, the experiment or the parent. Re-running the same `hydra.sweep.dir` reuses that parent.
`on_multirun_end` summarizes the parent's children, logs the summary to the parent, closes it, and
makes the command fail, naming the failed jobs, if any job failed.

MLflow is imported inside the hooks: Hydra instantiates callbacks for single runs too, and a single
run's config error should be reported without first paying for importing MLflow.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from runner.config.check import check_sweep_points
from runner.config.settings import sweep_settings
from runner.errors import RunnerError, report
from runner.lifeline import Process, lifeline
from runner.sweeps.folds import check_folds
from runner.sweeps.grid_study import create_grid_study
from runner.sweeps.launchers import check_before_sweep, launcher_of
from runner.sweeps.pruning import check_sweep
from runner.sweeps.study import is_optuna_sweep, open_storage, storage_of
from runner.sweeps.sweep_config import SweepConfig
from runner.sweeps.terms import (
    BEST_CONFIGURATION_TAG,
    CHOSEN_BY_TAG,
    OVERRIDES_TAG,
    PARENT_RUN_ID_FILE,
    REGISTERED_VERSION_TAG,
    SCORES_TAG,
    SWEEP_DIR_TAG,
    SWEPT_KEYS_TAG,
    TASK_OBJECTIVE_TAG,
    read_parent_run_id,
    record_tracking_uri,
    run_name_for,
)
from runner.sweeps.warm_pool import POOL, worker_kind
from runner.tracking.server_access import check_server
from runner.verbosity import configure, is_verbose, loading_tensorflow

if TYPE_CHECKING:
    from runner.sweeps.outputs import SweepFacts

log = logging.getLogger("runner")


def sweep_dir_of(config: DictConfig) -> str:
    return os.path.abspath(str(config.hydra.sweep.dir))


def swept_keys(config: DictConfig) -> list[str]:
    """Keys whose value differs between jobs: sweep overrides (batch=32,64) and the sweeper's own
    search space (hydra.sweeper.params, as optuna has)."""
    overrides = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
    keys = [override.key_or_group for override in overrides if override.is_sweep_override()]
    params = OmegaConf.select(config, "hydra.sweeper.params")
    for key in params or {}:
        if key not in keys:
            keys.append(str(key))
    return keys


def _exit_with(error: RunnerError, code: int) -> None:
    # A callback's exceptions only become warnings in Hydra; SystemExit is what stops the command.
    report("error", error)
    sys.exit(code)


class SweepCallback(Callback):
    """Creates (or reuses) the sweep's parent run before the jobs; summarizes and closes it after."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            sweep_settings(config)
            check_sweep_points(config)
            check_optuna_sweep(config)
            # Before the parent run exists: a sweep that cannot start, or a server that is down or refuses
            # this user, leaves nothing behind.
            sweep = SweepConfig.read(config)  # also refuses an empty experiment name, a bad model name, ...
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
            parent_id = start_parent_run(config, sweep)
        except RunnerError as error:
            POOL.close()
            _exit_with(error, 2)
        if started_a_worker:  # the first run waits for it to import TensorFlow: time for what the sweep's end needs
            from runner.sweeps.outputs import load_ahead  # noqa: PLC0415  MLflow, scipy, matplotlib: only for a sweep

            load_ahead()
        log.info(
            "sweep %s: MLflow parent run %s; MLflow UI: %s",
            run_name_for(sweep_dir_of(config)),
            parent_id,
            parent_ui_link(sweep, parent_id),
        )

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        # The warm workers of this process (the basic launcher's): the runs still ending finish first, so that the
        # summary and the registry below read every run FINISHED with its model; an idle one logs the champion's
        # model where the sweep leaves that to its end (runner.sweeps.champion).
        try:
            try:
                POOL.settle(SweepConfig.read(config).sweep.worker_memory_mb)
                finish_parent_run(config)
            finally:
                POOL.close()
        except RunnerError as error:
            _exit_with(error, 1)


def _start_first_worker(config: DictConfig, sweep: SweepConfig) -> bool:
    """Where the sweep's jobs run in this process and train in warm workers (runner.sweeps.warm_pool), the first
    worker starts importing now, beside the parent run's and the study's creation; whether it did."""
    launcher = launcher_of(_launcher_target(config))
    if launcher is None or not launcher.jobs_in_the_sweeps_process or worker_kind(sweep) is None:
        return False
    POOL.start_ahead(lifeline([Process.this()]))
    return True


def _launcher_target(config: DictConfig) -> str:
    return str(OmegaConf.select(config, "hydra.launcher._target_") or "")


def check_optuna_sweep(config: DictConfig) -> None:
    """The sweep's rules and its pruner (runner.sweeps.pruning.check_sweep) and, for an Optuna sweep, its settings
    and a study storage that opens."""

    check_sweep(config)
    if is_optuna_sweep(config):
        from runner.sweeps.optuna_sweeper import check_settings  # noqa: PLC0415  Optuna: only for an Optuna sweep

        check_settings(config)
        open_storage(storage_of(OmegaConf.select(config, "hydra.sweeper.storage"), sweep_dir_of(config)))


def parent_ui_link(sweep: SweepConfig, parent_id: str) -> str:
    """Where the MLflow UI shows the sweep's experiment (its runs table) and its parent run."""
    from runner.tracking.store import open_client, sqlite_file  # noqa: PLC0415  MLflow: only once a sweep starts (Hydra makes this callback for single runs too)
    from runner.tracking.ui import ui_link  # noqa: PLC0415  MLflow: only once a sweep starts (Hydra makes this callback for single runs too)

    client = open_client(sweep.tracking_uri)
    database = sqlite_file(client.tracking_uri)
    tracking_uri = f"sqlite:///{database}" if database else client.tracking_uri
    return ui_link(tracking_uri, client.get_run(parent_id).info.experiment_id, parent_id)


def start_parent_run(config: DictConfig, sweep: SweepConfig) -> str:
    """Create the sweep's parent run, or reuse the one the sweep directory names. `config`: the sweep's composed
    config (its `hydra` node: the sweep directory and overrides); `sweep`: what it asks, read (SweepConfig.read)."""
    from mlflow import get_tracking_uri  # noqa: PLC0415  MLflow: only once a sweep starts (Hydra makes this callback for single runs too)
    from mlflow.entities import RunStatus  # noqa: PLC0415  MLflow: only once a sweep starts (Hydra makes this callback for single runs too)
    from mlflow.exceptions import MlflowException  # noqa: PLC0415  MLflow: only once a sweep starts (Hydra makes this callback for single runs too)

    from runner.tracking.mlflow_tracker import get_or_create_experiment  # noqa: PLC0415  MLflow: only once a sweep starts (Hydra makes this callback for single runs too)
    from runner.tracking.provenance import run_tags as provenance_tags  # noqa: PLC0415  MLflow: only once a sweep starts (Hydra makes this callback for single runs too)
    from runner.tracking.store import open_client  # noqa: PLC0415  MLflow: only once a sweep starts (Hydra makes this callback for single runs too)

    sweep_dir = sweep_dir_of(config)
    os.makedirs(sweep_dir, exist_ok=True)
    tags = {
        **provenance_tags(),
        OVERRIDES_TAG: " ".join(config.hydra.overrides.task),
        SWEPT_KEYS_TAG: ",".join(swept_keys(config)),
        SWEEP_DIR_TAG: sweep_dir,
        SCORES_TAG: sweep.table.as_text(),
        TASK_OBJECTIVE_TAG: sweep.score,
    }
    try:
        client = open_client(sweep.tracking_uri)  # the store, created before any job runs
        record_tracking_uri(sweep_dir, client.tracking_uri)  # for python -m runner.report, from any directory
        parent_id = read_parent_run_id(sweep_dir)
        if parent_id is not None:
            try:
                parent = client.get_run(parent_id)
            except MlflowException:  # the id is from another tracking store: start afresh
                parent = None
            if parent is not None and parent.info.lifecycle_stage == "active":
                client.update_run(parent_id, status=RunStatus.to_string(RunStatus.RUNNING))
                for key, value in tags.items():
                    client.set_tag(parent_id, key, value)
                return parent_id
        experiment_id = get_or_create_experiment(client, sweep.tracking.experiment_name)
        parent_id = client.create_run(experiment_id, tags=tags, run_name=run_name_for(sweep_dir)).info.run_id
    except MlflowException as error:
        raise RunnerError(
            f"mlflow.tracking_uri={sweep.tracking_uri or get_tracking_uri()!r} could not hold the sweep's "
            f"parent run: {error}. "
            "Fix: point mlflow.tracking_uri at a reachable tracking server or a writable sqlite:///path.db."
        ) from error
    with open(os.path.join(sweep_dir, PARENT_RUN_ID_FILE), "w") as handle:
        handle.write(parent_id + "\n")
    return parent_id


def finish_parent_run(config: DictConfig) -> None:
    """Log the summary of the parent's children to it, print it, close the parent, and raise a
    RunnerError naming the failed jobs if there are any."""
    from mlflow.entities import RunStatus  # noqa: PLC0415  MLflow: only once the sweep ends
    from mlflow.tracking import MlflowClient  # noqa: PLC0415  MLflow: only once the sweep ends

    from runner.sweeps.outputs import write_outputs  # noqa: PLC0415  MLflow: only once the sweep ends

    sweep_dir = sweep_dir_of(config)
    parent_id = read_parent_run_id(sweep_dir)
    if parent_id is None:  # on_multirun_start did not get as far as creating it
        return
    sweep = SweepConfig.read(config)
    client = MlflowClient(tracking_uri=sweep.tracking_uri)
    status = RunStatus.FAILED
    try:
        summary, paths = write_outputs(client, parent_id, _facts(config, sweep, sweep_dir), sweep_dir, sweep_dir)
        objective = summary.objective  # the test set's, where the data could not be split
        client.set_tag(parent_id, CHOSEN_BY_TAG, objective)
        for path in paths:
            client.log_artifact(parent_id, path)
        if summary.best is not None:
            client.log_metric(parent_id, f"best_{objective}", summary.best.metrics[objective])
        best = summary.best_configuration
        if best is not None:
            mean, std = best.mean(objective), best.std(objective)
            assert mean is not None  # the best configuration is the one with the best mean
            client.log_metric(parent_id, f"best_{objective}_mean", mean)
            if std is not None:  # a standard deviation needs two seeds
                client.log_metric(parent_id, f"best_{objective}_std", std)
            client.set_tag(parent_id, BEST_CONFIGURATION_TAG, best.configuration)
            for key, mean, std, _ in summary.winner_tests():  # the winner's test value of every metric of the task
                client.log_metric(parent_id, f"best_{key}_mean", mean)
                if std is not None:
                    client.log_metric(parent_id, f"best_{key}_std", std)
        print(summary.markdown() + "\n" + summary.jobs_markdown(), flush=True)
        failed = summary.failed
        if summary.best is not None:
            if not sweep.tracking.log_model:
                print("mlflow.log_model=false: the jobs logged no model, so none is registered", flush=True)
            elif failed:
                # The best of an unfinished sweep may not be its best: registered now, it could hold @champion
                # (which moves only to a strictly better version) against the job that is best once all finish.
                print(
                    f"{len(failed)} of {len(summary.rows)} jobs did not finish, so no model is registered yet: "
                    "the re-run that finishes them registers the sweep's best job",
                    flush=True,
                )
            else:
                if sweep.sweep.trial_models == "champion":
                    from runner.sweeps.champion import log_champion_model  # noqa: PLC0415  MLflow: only once the sweep ends

                    won = summary.best
                    log_champion_model(client, sweep, sweep_dir, won.run_id, f"job {won.job} ({won.overrides})")
                _register_best(client, sweep, sweep_dir, parent_id, summary.best, objective)
        if not failed:
            status = RunStatus.FINISHED
    finally:
        # Whatever happened while summarizing, the parent must not stay RUNNING.
        client.set_terminated(parent_id, RunStatus.to_string(status))
    if failed:
        raise _failed_jobs(summary, parent_id, sweep_dir)


def _failed_jobs(summary, parent_id: str, sweep_dir: str) -> RunnerError:
    """The sweep's error naming its failed jobs; where every job failed, it says that nothing finished."""
    failed = summary.failed
    jobs = "; ".join(f"job {row.job} ({row.overrides or 'no overrides'}): {_shorten(row.error)}" for row in failed)
    said = f"{len(failed)} of {len(summary.rows)} sweep jobs failed: {jobs}."
    if summary.all_failed:
        said += f" None finished, so the summary above and MLflow parent run {parent_id} have no best configuration."
    else:
        said += f" The others finished and are in the summary above and under MLflow parent run {parent_id}."
    return RunnerError(
        f"{said} Fix: correct the failing values, or re-run the same command with hydra.sweep.dir={sweep_dir} to "
        "run only the jobs that did not finish."
    )


def _facts(config: DictConfig, sweep: SweepConfig, sweep_dir: str) -> SweepFacts:
    """The sweep's facts (runner.sweeps.outputs): what it asks, and its study and search space from its composed
    config."""
    from runner.sweeps.outputs import SweepFacts  # noqa: PLC0415  MLflow: only once the sweep ends
    from runner.sweeps.report import find_study, log_scaled_keys  # noqa: PLC0415  Plotly: only once the sweep ends

    default = sweep.objective_is_default
    return SweepFacts(
        objective=sweep.objective,
        direction=sweep.direction,
        table=sweep.table,
        fallback=sweep.fallback_objective if default else None,
        asked=not default,
        study=find_study(sweep_dir, {}, config),
        log_keys=frozenset(log_scaled_keys(config)),
    )


def _register_best(client, sweep: SweepConfig, sweep_dir: str, parent_id: str, best, objective: str) -> None:
    """The best job's model as a new version of mlflow.registered_model_name, tagged with this sweep."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415  MLflow: only once the sweep ends

    from runner.tracking.registry import SWEEP_TAG, register_run_model  # noqa: PLC0415  MLflow: only at the end

    name = sweep.tracking.registered_model_name
    try:
        registration = register_run_model(
            client,
            name,
            best.run_id,
            objective,
            best.metrics[objective],
            sweep.table.lower_is_better(objective, sweep.direction),  # what it chose by (the fallback, if so)
            tags={SWEEP_TAG: parent_id},
        )
    except MlflowException as error:
        raise RunnerError(
            f"the sweep's best job {best.job} (MLflow run {best.run_id}) could not be registered as a version of "
            f"{name!r} at {client.tracking_uri}: {error.message}. Fix: make the Model Registry writable for "
            f"you, then re-run the same sweep command with hydra.sweep.dir={sweep_dir}: its finished "
            "jobs are skipped and the best one is registered."
        ) from None
    client.set_tag(parent_id, REGISTERED_VERSION_TAG, f"{registration.name}/{registration.version}")
    print(f"best job {best.job} ({best.overrides}): {registration.describe()}", flush=True)


def _shorten(text: str, limit: int = 300) -> str:
    text = " ".join((text or "no error recorded").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."

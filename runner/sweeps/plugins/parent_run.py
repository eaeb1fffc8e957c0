"""A sweep's MLflow parent run: created (or reused) before any job starts, and at the sweep's end given the summary
of its children, the best job's registered model and its status; ended FAILED when the sweep itself stops with an
error (its launcher cannot submit its jobs), since Hydra calls the callback's on_multirun_end only after a sweep
that returned and the parent would otherwise stay RUNNING in the MLflow UI as if the sweep still ran."""

from __future__ import annotations

import logging
import os
from typing import Any

from mlflow import get_tracking_uri
from mlflow.entities import RunStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from runner.config.settings import mlflow_settings
from runner.errors import RunnerError
from runner.sweeps.job.champion import log_champion_model
from runner.sweeps.report.outputs import SweepFacts, load_ahead, trade_off_of, write_outputs
from runner.sweeps.report.report import find_study, log_scaled_keys
from runner.sweeps.report.summary import Summary
from runner.sweeps.sweep_config import SweepConfig, sweep_dir_of, swept_keys
from runner.sweeps.terms import (
    BEST_CONFIGURATION_TAG,
    CHOSEN_BY_TAG,
    CONSTRAINTS_TAG,
    OBJECTIVES_TAG,
    OVERRIDES_TAG,
    PARENT_RUN_ID_FILE,
    PARETO_FRONT_TAG,
    REGISTERED_VERSION_TAG,
    SCORES_TAG,
    SWEEP_DIR_TAG,
    SWEPT_KEYS_TAG,
    TASK_OBJECTIVE_TAG,
    read_parent_run_id,
    record_tracking_uri,
    run_name_for,
)
from runner.tracking.mlflow_tracker import get_or_create_experiment
from runner.tracking.provenance import run_tags as provenance_tags
from runner.tracking.registry import SWEEP_TAG, register_run_model
from runner.tracking.run_writer import end_failed
from runner.tracking.store import open_client, sqlite_file
from runner.tracking.ui import ui_link

__all__ = ["fail_parent_run", "finish_parent_run", "load_ahead", "parent_ui_link", "start_parent_run"]

log = logging.getLogger("runner")


def parent_ui_link(sweep: SweepConfig, parent_id: str) -> str:
    """Where the MLflow UI shows the sweep's experiment (its runs table) and its parent run."""

    client = open_client(sweep.tracking_uri)
    database = sqlite_file(client.tracking_uri)
    tracking_uri = f"sqlite:///{database}" if database else client.tracking_uri
    return ui_link(tracking_uri, client.get_run(parent_id).info.experiment_id, parent_id)


def start_parent_run(config: DictConfig, sweep: SweepConfig) -> str:
    """Create the sweep's parent run, or reuse the one the sweep directory names. `config`: the sweep's composed
    config (its `hydra` node: the sweep directory and overrides); `sweep`: what it asks, read (SweepConfig.read)."""

    sweep_dir = sweep_dir_of(config)
    os.makedirs(sweep_dir, exist_ok=True)
    tags = {
        **provenance_tags(),
        OVERRIDES_TAG: " ".join(config.hydra.overrides.task),
        SWEPT_KEYS_TAG: ",".join(swept_keys(config)),
        SWEEP_DIR_TAG: sweep_dir,
        SCORES_TAG: sweep.table.as_text(),
        TASK_OBJECTIVE_TAG: sweep.score,
        **({OBJECTIVES_TAG: sweep.goals.as_text()} if sweep.goals.several else {}),
        **({CONSTRAINTS_TAG: "; ".join(map(str, sweep.goals.constraints))} if sweep.goals.constraints else {}),
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


def finish_parent_run(config: DictConfig, sweep: SweepConfig) -> None:
    """Log the summary of the parent's children to it, print it, close the parent, and raise a
    RunnerError naming the failed jobs if there are any. `config`: the sweep's composed config; `sweep`: what it
    asks, read (SweepConfig.read)."""

    sweep_dir = sweep_dir_of(config)
    parent_id = read_parent_run_id(sweep_dir)
    if parent_id is None:  # on_multirun_start did not get as far as creating it
        return
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
        if summary.trade_off:
            client.set_tag(parent_id, PARETO_FRONT_TAG, "; ".join(row.configuration for row in summary.front))
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


def _failed_jobs(summary: Summary, parent_id: str, sweep_dir: str) -> RunnerError:
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
    """The sweep's facts (runner.sweeps.report.outputs): what it asks, and its study and search space from its composed
    config."""

    default = sweep.objective_is_default
    return SweepFacts(
        objective=sweep.objective,
        direction=sweep.direction,
        table=sweep.table,
        fallback=sweep.fallback_objective if default else None,
        asked=not default,
        study=find_study(sweep_dir, {}, config),
        log_keys=frozenset(log_scaled_keys(config)),
        trade_off=trade_off_of(sweep.goals),
        constraints=sweep.goals.constraints,
    )


def _register_best(client, sweep: SweepConfig, sweep_dir: str, parent_id: str, best, objective: str) -> None:
    """The best job's model as a new version of mlflow.registered_model_name, tagged with this sweep."""

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


def fail_parent_run(config: Any, error: str) -> None:
    """Mark the parent run of the sweep `config` (the sweep's whole config, hydra node included) FAILED with
    `error` as its error tag; nothing if the sweep has no parent run yet. Best effort: the error being reported
    matters more than the run's status, so a store that cannot be reached is only logged."""
    parent_id = read_parent_run_id(sweep_dir_of(config))
    if parent_id is None:
        return
    try:
        end_failed(MlflowClient(tracking_uri=mlflow_settings(config).tracking_uri or None), parent_id, error)
    except MlflowException as failure:
        log.warning("the sweep's parent run %s could not be marked FAILED: %s", parent_id, failure)

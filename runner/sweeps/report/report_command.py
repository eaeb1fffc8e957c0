"""`python -m runner.report <sweep dir | parent run id> [--tracking-uri URI] [--out DIR]` (runner/report.py): a
sweep's report (sweep_report.html) and summaries (sweep_summary.csv/.md, sweep_jobs.csv/.md, sweep_curves.png),
rebuilt from the MLflow store alone: for a sweep that ran on another machine, or to see one again after more runs
finished.

It reads what the sweep's own end (runner.sweeps.plugins.parent_run.finish_parent_run) reads: the parent run's children,
the objective the parent records as chosen_by, the swept keys; so the report it writes equals the sweep's own, up
to its `Generated` line (runner.sweeps.report.outputs builds both). Nothing is logged to MLflow: the files are
written to --out."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlflow import get_tracking_uri
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from omegaconf import OmegaConf

from runner.config.objective import Constraint, Objective, agreed_direction
from runner.config.schema import TaskSettings
from runner.config.settings import mlflow_settings
from runner.errors import RunnerError
from runner.metric_table import DEFAULT_TABLE, MINIMIZE, MetricTable
from runner.sweeps.report.outputs import SweepFacts, trade_off_of, write_outputs
from runner.sweeps.report.report import find_study, given_overrides, log_scaled_keys
from runner.sweeps.sweep_config import SweepConfig
from runner.sweeps.terms import (
    CHOSEN_BY_TAG,
    CONSTRAINTS_TAG,
    OBJECTIVES_TAG,
    OVERRIDES_TAG,
    PARENT_RUN_ID_FILE,
    SCORES_TAG,
    SWEEP_DIR_TAG,
    TASK_OBJECTIVE_TAG,
    TRACKING_URI_FILE,
    read_parent_run_id,
    read_tracking_uri,
)
from runner.tracking.store import absolute_tracking_uri, sqlite_file


def _multirun(sweep_dir: str):
    """The sweep's composed config, which Hydra writes to <sweep dir>/multirun.yaml; None where it is not here."""
    path = os.path.join(sweep_dir, "multirun.yaml")
    return OmegaConf.load(path) if os.path.isfile(path) else None


@dataclass(frozen=True)
class Store:
    """The MLflow store to read and where it came from, as the messages name it."""

    uri: str
    said: str


def _store(target: str, given: str | None) -> Store:
    """--tracking-uri, else the store the sweep directory recorded when its sweep started (mlflow_tracking_uri.txt,
    absolute), else its multirun.yaml's mlflow.tracking_uri (a relative sqlite path taken from the directory the
    sweep started in), else MLflow's default (MLFLOW_TRACKING_URI, or sqlite:///mlflow.db here)."""

    if given:
        return Store(given, f"--tracking-uri={given!r}")
    if os.path.isdir(target):
        recorded = read_tracking_uri(target)
        if recorded is not None:
            return Store(recorded, f"the sweep's store {recorded!r} (from its {TRACKING_URI_FILE})")
        config = _multirun(target)
        named = mlflow_settings(config).tracking_uri if config is not None else None
        if named:
            started_in = OmegaConf.select(config, "hydra.runtime.cwd") or os.getcwd()
            uri = absolute_tracking_uri(str(named), str(started_in))
            return Store(uri, f"the sweep's store {uri!r} (mlflow.tracking_uri in its multirun.yaml)")
    default = get_tracking_uri()
    return Store(default, f"MLflow's default store {default!r} (MLFLOW_TRACKING_URI, else ./mlflow.db)")


def _parent_run_id(target: str) -> str:

    if not os.path.isdir(target):
        if os.path.exists(target) or _looks_like_a_path(target):
            what = "a file, not a directory" if os.path.exists(target) else "a directory that does not exist"
            where = "" if os.path.isabs(target) else f" (relative to {os.getcwd()})"
            raise RunnerError(
                f"{target!r} is not valid: it is {what}{where}. Fix: pass the sweep directory (hydra.sweep.dir, "
                "e.g. multirun/2026-01-31/12-00-00), or the MLflow parent run id the sweep printed "
                "(`sweep ...: MLflow parent run <id>`)."
            )
        return target
    parent_id = read_parent_run_id(target)
    if parent_id is None:
        raise RunnerError(
            f"{target!r} is not valid: it is a directory without {PARENT_RUN_ID_FILE}, so not a sweep directory "
            "whose sweep started (hydra.sweep.dir, e.g. multirun/2026-01-31/12-00-00). Fix: pass the sweep "
            "directory, or the MLflow parent run id the sweep printed (`sweep ...: MLflow parent run <id>`)."
        )
    return parent_id


def _looks_like_a_path(target: str) -> bool:
    """A run id is letters and digits: a separator or a leading `.` or `~` means a directory was meant."""
    return "/" in target or os.sep in target or target.startswith((".", "~"))


def _open(store: Store):

    database = sqlite_file(store.uri)
    if database is not None and not os.path.exists(database):
        # MLflow would create an empty store there, in which no run can be found.
        raise RunnerError(
            f"{store.said} is not valid: there is no MLflow store at {database}. Fix: pass the sweep's store "
            "with --tracking-uri (sqlite:///path/to/mlflow.db or the tracking server's URL)."
        )
    return MlflowClient(tracking_uri=store.uri)


def write(target: str, tracking_uri: str | None = None, out: str | None = None) -> list[str]:
    """Write the report and summaries of the sweep `target` (its directory or its parent run id) into `out`
    (default: the sweep directory given, else the current directory); return the files' paths."""
    parent_id = _parent_run_id(target)
    store = _store(target, tracking_uri)
    client = _open(store)
    try:
        parent = client.get_run(parent_id)
    except MlflowException as error:
        raise RunnerError(
            f"{target!r} is not valid: {store.said} has no run {parent_id!r} ({error.message[:200]}). "
            "Fix: pass the sweep's parent run id (its sweep directory's mlflow_parent_run_id.txt) and the store "
            "it is in with --tracking-uri."
        ) from None
    tags = parent.data.tags
    if MLFLOW_PARENT_RUN_ID in tags:
        raise RunnerError(
            f"{target!r} is not valid: run {parent_id} is a child run of sweep parent {tags[MLFLOW_PARENT_RUN_ID]}. "
            f"Fix: pass the parent: python -m runner.report {tags[MLFLOW_PARENT_RUN_ID]}."
        )
    if SWEEP_DIR_TAG not in tags:
        raise RunnerError(
            f"{target!r} is not valid: run {parent_id} is not a sweep's parent run (it has no {SWEEP_DIR_TAG} tag). "
            "Fix: pass the parent run id a `python -m runner -m ...` sweep printed."
        )
    given = given_overrides(tags.get(OVERRIDES_TAG, ""))
    sweep_dir = tags[SWEEP_DIR_TAG]
    local_dir = target if os.path.isdir(target) else sweep_dir  # the sweep directory, where it is on this machine
    directory = out or (target if os.path.isdir(target) else os.getcwd())
    os.makedirs(directory, exist_ok=True)
    facts = _facts(tags, given, _multirun(local_dir), local_dir)
    return write_outputs(client, parent_id, facts, sweep_dir, directory)[1]


def _facts(tags: Mapping[str, str], given: Mapping[str, str], config: Any, local_dir: str) -> SweepFacts:
    """The sweep's facts from its parent run (the objective its end recorded as chosen_by; before it ends, the one
    it will choose on) and its multirun.yaml where the sweep directory is here."""
    read = SweepConfig.read(config) if config is not None else None
    goal = read.goal if read is not None else _recorded_goal(tags, given)
    if read is not None:
        trade_off, constraints = trade_off_of(read.goals), read.goals.constraints
    else:
        trade_off, constraints = _recorded_trade_off(tags, goal.table)
    return SweepFacts(
        objective=tags.get(CHOSEN_BY_TAG) or goal.name,  # what the sweep's end recorded as having chosen
        direction=goal.direction,
        table=goal.table,
        fallback=None if CHOSEN_BY_TAG in tags or not goal.is_default else goal.fallback,
        asked=not goal.is_default,  # whether sweep.objective named it, as the sweep's end says
        study=find_study(local_dir, given, config),
        log_keys=frozenset(log_scaled_keys(config, tags.get(OVERRIDES_TAG, ""))),
        trade_off=trade_off,
        constraints=constraints,
    )


def _recorded_trade_off(
    tags: Mapping[str, str], table: MetricTable
) -> tuple[tuple[tuple[str, bool], ...], tuple[Constraint, ...]]:
    """A sweep's objectives (several) and constraints as its parent run recorded them."""
    pairs = [item.partition(":") for item in tags.get(OBJECTIVES_TAG, "").split(",") if item]
    trade_off = tuple((name, direction == MINIMIZE) for name, _, direction in pairs)
    texts = [text for text in tags.get(CONSTRAINTS_TAG, "").split("; ") if text]
    return trade_off, tuple(Constraint.parse(text, table) for text in texts)


def _recorded_goal(tags: Mapping[str, str], given: Mapping[str, str]) -> Objective:
    """The objective of a sweep whose directory is not here: what its parent run recorded (the jobs' scores, the
    task's score) and the command's overrides (the schema's defaults for a sweep that recorded neither)."""
    table = MetricTable.from_text(tags[SCORES_TAG]) if SCORES_TAG in tags else DEFAULT_TABLE
    score = given.get("task.objective") or tags.get(TASK_OBJECTIVE_TAG) or TaskSettings().objective
    if OBJECTIVES_TAG in tags:  # several: the one that chooses, with the direction recorded for it
        recorded = dict(item.partition(":")[::2] for item in tags[OBJECTIVES_TAG].split(",") if item)
        chosen = given.get("sweep.choose") or next(iter(recorded))
        return Objective(chosen, score, recorded.get(chosen), table)
    direction = agreed_direction(given.get("hydra.sweeper.direction"), given.get("sweep.direction"))
    return Objective(given.get("sweep.objective"), score, direction, table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner.report",
        description="Write a sweep's report (sweep_report.html) and summaries from its MLflow parent run's children.",
    )
    parser.add_argument("target", metavar="SWEEP_DIR_OR_PARENT_RUN_ID", help="the sweep directory or its parent run id")
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="the MLflow store (default: the one the sweep directory records, else MLFLOW_TRACKING_URI)",
    )
    parser.add_argument(
        "--out", default=None, help="where to write (default: the sweep directory given, else the current directory)"
    )
    args = parser.parse_args(argv)
    try:
        paths = write(args.target, args.tracking_uri, args.out)
    except RunnerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0

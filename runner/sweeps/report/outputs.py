"""A sweep's outputs, built in one place: the summaries (runner.sweeps.report.summary) and the report
(runner.sweeps.report.report) from the parent run's children, for the sweep's own end
(runner.sweeps.plugins.parent_run) and for `python -m runner.report` (runner.sweeps.report.report_command), which
differ only in where they learn the sweep's facts (its composed config, or its parent run and directory)."""

from __future__ import annotations

from dataclasses import dataclass

from mlflow.tracking import MlflowClient

from runner.config.objective import Constraint, Objectives
from runner.metric_table import MetricTable
from runner.plots import import_pyplot
from runner.sweeps.report import summary as sweep_summary
from runner.sweeps.report.report import write_report
from runner.sweeps.sweep_config import StudyAddress


@dataclass(frozen=True)
class SweepFacts:
    """What the summaries and the report need to know of a sweep beyond its runs."""

    objective: str  # what chooses (sweep.objective, or the one its end recorded)
    direction: str | None  # the sweep's (runner.config.objective; None: the objective's own)
    table: MetricTable  # the jobs' metrics (the sweep's `metrics`): the objective's direction, the columns, curves
    fallback: str | None  # where no finished job has `objective` (the default on data that could not be split)
    asked: bool  # sweep.objective named the objective
    study: StudyAddress | None  # an Optuna sweep's study, for the parameter importances
    log_keys: frozenset[str]  # keys swept on a log scale, drawn on a log axis
    # Several objectives: each (name, lower is better), in sweep.objective's order; empty for one objective.
    trade_off: tuple[tuple[str, bool], ...] = ()
    constraints: tuple[Constraint, ...] = ()  # sweep.constraints


def trade_off_of(goals: Objectives) -> tuple[tuple[str, bool], ...]:
    """A sweep's objectives as its summary weighs them (SweepFacts.trade_off): empty for one objective."""
    return tuple((goal.name, goal.lower_is_better()) for goal in goals.each) if goals.several else ()


def write_outputs(
    client: MlflowClient, parent_id: str, facts: SweepFacts, sweep_dir: str, directory: str
) -> tuple[sweep_summary.Summary, list[str]]:
    """Collect the sweep's runs and write its summaries and report into `directory`; return the summary (its
    objective: the one that chose, the fallback where it had to) and the files' paths."""
    summary = sweep_summary.collect(
        client,
        parent_id,
        facts.objective,
        facts.table.lower_is_better(facts.objective, facts.direction),
        fallback=facts.fallback,
        asked=facts.asked,
        table=facts.table,
        trade_off=facts.trade_off,
        constraints=facts.constraints,
    )
    paths = sweep_summary.write(summary, directory)
    lower = facts.table.lower_is_better(summary.objective, facts.direction)
    paths.append(write_report(summary, directory, sweep_dir, lower, facts.study, facts.log_keys))
    return summary, paths


def load_ahead() -> None:
    """Import what writing a sweep's outputs draws with (matplotlib's pyplot; this module's imports bring scipy's
    statistics, plotly and Optuna's importances): the sweep's own process does, while its first warm worker starts
    (runner.sweeps.plugins.lifecycle), rather than after its last run."""
    import_pyplot()

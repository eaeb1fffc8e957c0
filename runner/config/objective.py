"""The objective a run or a sweep chooses by, and its direction, derived in one place.

`Objective.of` is the rule: `sweep.objective` where it is set, else the task's score (`task.objective`) on the
validation split a sweep's job holds out (`val_<score>`), or on the test set where the data cannot be split
(`test_<score>`); its direction is `sweep.direction` or `hydra.sweeper.direction` (which must agree), else the metric
table's own for the objective, and a direction against the table's own is refused unless
`sweep.direction_against_metric` says it is meant. The sweep's process (runner.sweeps.sweep_config), each of its
jobs, the Optuna sweeper's study, the trainer's registration and the report command all read it from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from runner.config.schema import SweepSettings
from runner.errors import RunnerError
from runner.metric_table import DIRECTIONS, MetricTable
from runner.outcome import default_objective, fallback_objective


def agreed_direction(sweeper: Any, sweep: str | None) -> str | None:
    """The sweep's direction: hydra.sweeper.direction (a name, or an enum whose name is one, as Hydra's Optuna
    sweeper has) or sweep.direction, which must agree where both are set; None: the objective's own."""
    sweeper = getattr(sweeper, "name", sweeper)
    if sweeper is not None and sweeper not in DIRECTIONS:
        raise RunnerError(
            f"hydra.sweeper.direction={sweeper!r} is not valid: a study maximizes or minimizes sweep.objective. "
            "Fix: pass hydra.sweeper.direction=maximize (scores) or minimize (losses, errors), or null for the "
            "objective's own.",
            key="hydra.sweeper.direction",
        )
    if sweeper is not None and sweep is not None and sweeper != sweep:
        raise RunnerError(
            f"hydra.sweeper.direction={sweeper} is not valid with sweep.direction={sweep}: a sweep has one "
            "direction. Fix: set one of them, or neither for the objective's own direction.",
            key="hydra.sweeper.direction",
        )
    chosen = sweeper if sweeper is not None else sweep
    return None if chosen is None else str(chosen)


@dataclass(frozen=True)
class Objective:
    """What a run or a sweep chooses by: read with `Objective.of`, which refuses a direction that cannot be meant."""

    asked: str | None  # sweep.objective; None: the task's score on validation (or on test, where there is none)
    score: str  # task.objective
    direction: str | None  # sweep.direction or hydra.sweeper.direction; None: the objective's own
    table: MetricTable  # the run's metrics and their directions

    @classmethod
    def of(cls, sweep: SweepSettings, score: str, table: MetricTable, sweeper_direction: Any = None) -> Objective:
        """The objective of `sweep` (the `sweep` group), the task's `score` and the metric `table`, with the
        Optuna sweeper's `sweeper_direction` where there is one: two directions that disagree, or one against the
        objective's own without sweep.direction_against_metric, are refused."""
        direction = agreed_direction(sweeper_direction, sweep.direction)
        objective = cls(sweep.objective, score, direction, table)
        named = (
            "hydra.sweeper.direction" if getattr(sweeper_direction, "name", sweeper_direction) else "sweep.direction"
        )
        table.check_direction(objective.name, direction, named, sweep.direction_against_metric)
        return objective

    @property
    def name(self) -> str:
        """The metric a sweep's job returns (and a run registers by): sweep.objective, else val_<task.objective>."""
        return self.asked or default_objective(self.score)

    @property
    def is_default(self) -> bool:
        """sweep.objective was left null: the task's score chooses, on validation or, without it, on test."""
        return self.asked is None

    @property
    def fallback(self) -> str:
        """What a null sweep.objective chooses on where the data cannot be split: the task's score on test."""
        return fallback_objective(self.score)

    def chosen_by(self, validates: bool) -> str:
        """The metric that chooses for a run that holds out a validation split (`validates`) or not."""
        return self.name if validates or not self.is_default else self.fallback

    def lower_is_better(self, key: str | None = None) -> bool:
        """Whether lower is better for `key` (the objective itself by default) in this objective's direction."""
        return self.table.lower_is_better(key or self.name, self.direction)

    @property
    def study_direction(self) -> Literal["minimize", "maximize"]:
        """The direction an Optuna study of this objective is created with: minimize or maximize."""
        return "minimize" if self.lower_is_better() else "maximize"

    @property
    def worst(self) -> float:
        """What a failed job returns to the sweeper: the worst value in this direction."""
        return float("inf") if self.lower_is_better() else float("-inf")

"""The objective a run or a sweep chooses by, and its direction, derived in one place.

`Objective.of` is the rule: `sweep.objective` where it is set, else the task's score (`task.objective`) on the
validation split a sweep's job holds out (`val_<score>`), or on the test set where the data cannot be split
(`test_<score>`); its direction is `sweep.direction` or `hydra.sweeper.direction` (which must agree), else the metric
table's own for the objective, and a direction against the table's own is refused unless
`sweep.direction_against_metric` says it is meant. The sweep's process (runner.sweeps.sweep_config), each of its
jobs, the Optuna sweeper's study, the trainer's registration and the report command all read it from here.

A sweep over several objectives (`sweep.objective=[val_accuracy,parameters]`) is `Objectives.of`: each objective with
its direction (`sweep.direction` as a list, one per objective, or each one's own), the one that chooses among the
configurations no other beats on all of them (`sweep.choose`, else the first: `Objectives.chosen`, which is what
`Objective.of` returns), and the constraints (`sweep.constraints`) a configuration must hold to be chosen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from runner.config.schema import SweepSettings
from runner.errors import RunnerError
from runner.metric_table import DIRECTIONS, MAXIMIZE, MINIMIZE, MetricTable
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
        """The objective that chooses in `sweep` (the `sweep` group: its only objective, or sweep.choose among several),
        of the task's `score` and the metric `table`, with the Optuna sweeper's `sweeper_direction` where there is
        one: two directions that disagree, or one against the objective's own without
        sweep.direction_against_metric, are refused (Objectives.of)."""
        return Objectives.of(sweep, score, table, sweeper_direction).chosen

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


@dataclass(frozen=True)
class Constraint:
    """`metric <= bound` or `metric >= bound` (sweep.constraints), on the mean of a configuration's runs."""

    metric: str
    operator: str  # "<=" or ">="
    bound: float

    @classmethod
    def parse(cls, text: str, table: MetricTable) -> Constraint:
        """One item of sweep.constraints; its metric must be one a finished run of `table` has."""
        match = re.fullmatch(r"\s*([A-Za-z_][\w./-]*)\s*(<=|>=)\s*([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)\s*", text)
        if match is None:
            raise RunnerError(
                f"sweep.constraints item {text!r} is not valid: a constraint is a metric, <= or >=, and a number. "
                "Fix: write e.g. \"sweep.constraints=['parameters <= 100000', 'latency_ms <= 2']\" (each quoted, as "
                "Hydra reads < and > only in quotes).",
                key="sweep.constraints",
            )
        metric = match.group(1)
        if metric not in table.result_keys:
            raise RunnerError(
                f"sweep.constraints item {text!r} is not valid: {metric} is not a number a finished run logs "
                f"({', '.join(table.result_keys)}). Fix: constrain one of those, e.g. 'parameters <= 100000'.",
                key="sweep.constraints",
            )
        return cls(metric, match.group(2), float(match.group(3)))

    def violation(self, value: float) -> float:
        """How far `value` is past the bound: zero or less where it holds (Optuna's convention for a constraint)."""
        return value - self.bound if self.operator == "<=" else self.bound - value

    def holds(self, value: float | None) -> bool:
        return value is not None and value == value and self.violation(value) <= 0

    def __str__(self) -> str:
        return f"{self.metric} {self.operator} {self.bound:g}"


@dataclass(frozen=True)
class Objectives:
    """What a sweep chooses by: its objectives (one, or several to trade off), the one among them that chooses its
    best configuration, and the constraints a configuration must hold to be chosen."""

    each: tuple[Objective, ...]
    chosen: Objective
    constraints: tuple[Constraint, ...] = ()

    @classmethod
    def of(cls, sweep: SweepSettings, score: str, table: MetricTable, sweeper_direction: Any = None) -> Objectives:
        names = sweep.objectives
        if len(set(names)) < len(names):
            raise RunnerError(
                f"sweep.objective={_listed(names)} is not valid: it names an objective twice. Fix: name each once.",
                key="sweep.objective",
            )
        directions = _per_objective(agreed_direction_of(sweeper_direction, sweep.direction, len(names)), len(names))
        named = (
            "hydra.sweeper.direction" if getattr(sweeper_direction, "name", sweeper_direction) else "sweep.direction"
        )
        each = []
        for asked, direction in zip(names, directions, strict=True):
            objective = Objective(asked, score, direction, table)
            table.check_direction(objective.name, direction, named, sweep.direction_against_metric)
            each.append(objective)
        chosen = each[0]
        if sweep.choose is not None:
            found = [objective for objective in each if objective.name == sweep.choose]
            if not found:
                raise RunnerError(
                    f"sweep.choose={sweep.choose} is not valid: it must be one of the objectives, "
                    f"{', '.join(objective.name for objective in each)}. Fix: name one of them, or null for the first.",
                    key="sweep.choose",
                )
            chosen = found[0]
        constraints = tuple(Constraint.parse(text, table) for text in sweep.constraints)
        return cls(tuple(each), chosen, constraints)

    @property
    def several(self) -> bool:
        """A trade-off: more than one objective (an Optuna study of several directions, a Pareto front)."""
        return len(self.each) > 1

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(objective.name for objective in self.each)

    @property
    def study_directions(self) -> list[Literal["minimize", "maximize"]]:
        return [objective.study_direction for objective in self.each]

    @property
    def constrained_metrics(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(constraint.metric for constraint in self.constraints))

    def as_text(self) -> str:
        """`val_accuracy:maximize,parameters:minimize`: what a sweep's parent run records of its objectives."""
        return ",".join(f"{o.name}:{MINIMIZE if o.lower_is_better() else MAXIMIZE}" for o in self.each)


def _listed(names: tuple[str | None, ...]) -> str:
    return "[" + ",".join(str(name) for name in names) + "]"


def agreed_direction_of(sweeper: Any, sweep: Any, count: int) -> Any:
    """The sweep's direction, one or one per objective (`count` of them): hydra.sweeper.direction and
    sweep.direction, which must agree where both are set."""
    if isinstance(sweeper, (list, tuple)) or isinstance(sweep, (list, tuple)) or count > 1:
        ours = _per_objective(sweep, count, "sweep.direction")
        theirs = _per_objective(
            [getattr(item, "name", item) for item in sweeper] if isinstance(sweeper, (list, tuple)) else sweeper,
            count,
            "hydra.sweeper.direction",
        )
        return tuple(agreed_direction(a, b) for a, b in zip(theirs, ours, strict=True))
    return agreed_direction(sweeper, sweep)


def _per_objective(direction: Any, count: int, key: str = "sweep.direction") -> tuple[str | None, ...]:
    """One direction per objective: a list of `count`, or null for each; a single one for a single objective."""
    if direction is None:
        return (None,) * count
    if isinstance(direction, (list, tuple)):
        if len(direction) == count:
            return tuple(direction)
    elif count == 1:
        return (direction,)
    given = list(direction) if isinstance(direction, (list, tuple)) else direction
    raise RunnerError(
        f"{key}={given} is not valid: the sweep has {count} objective(s), and a direction is given for each or for "
        f"none. Fix: pass {key} as a list of {count} (minimize or maximize, in sweep.objective's order), or null "
        "for each objective's own direction.",
        key=key,
    )

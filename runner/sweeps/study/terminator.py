"""Knowing when to stop an Optuna study (`hydra.sweeper.terminate=regret`): the study ends once the most its best
configuration could still improve is smaller than the noise of the objective between that configuration's
replicates (its seeds and folds), that is, once a better trial could not be told from a luckier one. This is the
rule of Makarova et al., "Automatic Termination for Hyperparameter Optimization" (AutoML 2022), as Optuna's
Terminator applied it (optuna.terminator, deprecated since Optuna 4.9), on Optuna's public API and two parts of the
runner's own:

- The room for improvement, RegretBound: the paper's upper bound on the regret (the largest upper confidence bound
  over the search space minus the largest lower confidence bound over the best trials) from a Gaussian process fitted
  to the study's trials with scikit-learn. Optuna's own RegretBoundEvaluator computes the same bound on its PyTorch
  Gaussian process, and PyTorch is not a dependency of the runner.
- The noise, ReplicateNoise: the standard error of the best trial's mean over its replicates, as the sweep report's
  intervals compute it (runner.sweeps.uncertainty.standard_error: s/√n over seeds, Nadeau and Bengio's corrected
  variance over folds, whose training sets overlap). Each trial's replicate values are a user attribute of the
  trial (REPLICATES_ATTR), set by its sweep job.

A trial the sampler proposed again (runner.sweeps.study.study.DUPLICATE_ATTR) was not trained: it adds no evidence."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.search_space import intersection_search_space
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from runner.sweeps.study.study import DUPLICATE_ATTR, REPLICATES_ATTR
from runner.sweeps.uncertainty import standard_error

TOP_TRIALS_RATIO = 0.5  # the bound looks at the better half of the trials (Optuna's default)
CANDIDATES = 2048  # random points of the search space where the upper confidence bound is sought
DELTA = 0.1  # the bound holds with probability 1 - DELTA under the Gaussian process


class Evaluator(Protocol):
    """One side of the rule, a number in the objective's units from the study's trials: the room for improvement
    (RegretBound) or the noise between replicates (ReplicateNoise)."""

    def evaluate(self, trials: list[FrozenTrial], study_direction: StudyDirection) -> float: ...


def beta(n_params: int, n_trials: int, delta: float = DELTA) -> float:
    """The confidence bounds' width factor: Srinivas et al.'s 2·log(|D|·t²·π²/(6δ)), scaled down by 5 as the
    paper's experiments do (the same as Optuna's RegretBoundEvaluator)."""
    return 2 * math.log(n_params * n_trials**2 * math.pi**2 / 6 / delta) / 5


def _completed(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    return [t for t in trials if t.state == TrialState.COMPLETE and DUPLICATE_ATTR not in t.user_attrs]


def _encoded(trials: Sequence[FrozenTrial], space: dict[str, BaseDistribution]) -> numpy.ndarray:
    """Each trial's parameters in the unit cube: numbers scaled to [0, 1] (on a log scale where the distribution is
    logarithmic), a category one-hot."""
    return numpy.array([_encode(trial.params, space) for trial in trials], dtype=float)


def _encode(params: dict[str, Any], space: dict[str, BaseDistribution]) -> list[float]:
    row: list[float] = []
    for name, distribution in space.items():
        if isinstance(distribution, CategoricalDistribution):
            row += [float(params[name] == choice) for choice in distribution.choices]
            continue
        low, high, value = distribution.low, distribution.high, float(params[name])  # type: ignore[attr-defined]
        if getattr(distribution, "log", False):
            low, high, value = math.log(low), math.log(high), math.log(value)
        row.append((value - low) / (high - low) if high > low else 0.5)
    return row


def _random_points(space: dict[str, BaseDistribution], count: int, rng: numpy.random.Generator) -> numpy.ndarray:
    columns = []
    for distribution in space.values():
        if isinstance(distribution, CategoricalDistribution):
            width = len(distribution.choices)
            columns.append(numpy.eye(width)[rng.integers(width, size=count)])
        else:
            columns.append(rng.random((count, 1)))
    return numpy.hstack(columns)


class RegretBound:
    """The upper bound on the regret of the study's best trial (in the objective's units): how much better than it
    the best configuration of the search space could still be, at confidence 1 - DELTA under a Gaussian process
    (Matérn 5/2 with a length scale per dimension, plus a learnt noise) fitted to the better half of the trials."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def evaluate(self, trials: list[FrozenTrial], study_direction: StudyDirection) -> float:
        # scikit-learn ships no type information; imported only by a study with a terminator.
        from sklearn.exceptions import ConvergenceWarning  # type: ignore[import-untyped]  # noqa: PLC0415
        from sklearn.gaussian_process import GaussianProcessRegressor  # type: ignore[import-untyped]  # noqa: PLC0415
        from sklearn.gaussian_process.kernels import (  # type: ignore[import-untyped]  # noqa: PLC0415
            ConstantKernel,
            Matern,
            WhiteKernel,
        )

        completed = _completed(trials)
        space = intersection_search_space(completed)
        if not completed or not space:
            return math.inf  # nothing to bound yet: keep going
        sign = -1.0 if study_direction == StudyDirection.MINIMIZE else 1.0  # maximized below
        values = sign * numpy.array([trial.value for trial in completed], dtype=float)
        points = _encoded(completed, space)
        top = max(2, int(len(values) * TOP_TRIALS_RATIO))
        best = numpy.argsort(values)[::-1][: min(top, len(values))]
        points, values = points[best], values[best]
        scale = max(float(values.std()), 1e-10)
        standardized = (values - values.mean()) / scale
        dimensions = points.shape[1]
        kernel = ConstantKernel(1.0, (1e-3, 1e3)) * Matern(
            length_scale=numpy.ones(dimensions), length_scale_bounds=(1e-2, 1e2), nu=2.5
        ) + WhiteKernel(1e-2, (1e-6, 1.0))
        model = GaussianProcessRegressor(kernel, n_restarts_optimizer=2, random_state=self.seed)
        with warnings.catch_warnings():  # a length scale at its bound (a flat or a steep objective) is no error here
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(points, standardized)
        width = math.sqrt(beta(len(space), len(points)))
        candidates = numpy.vstack([points, _random_points(space, CANDIDATES, numpy.random.default_rng(self.seed))])
        mean, std = model.predict(candidates, return_std=True)
        highest_upper = float(numpy.max(mean + width * std))
        mean, std = model.predict(points, return_std=True)
        highest_lower = float(numpy.max(mean - width * std))
        return (highest_upper - highest_lower) * scale


class ReplicateNoise:
    """The standard error of the best trial's mean objective over its replicates (REPLICATES_ATTR); minus infinity
    (never stop) while the best trial has fewer than two: noise that cannot be
    measured stops nothing."""

    def __init__(self, folds: int = 0):
        self.folds = folds

    def evaluate(self, trials: list[FrozenTrial], study_direction: StudyDirection) -> float:
        completed = _completed(trials)
        if not completed:
            return -math.inf  # nothing is known: never stop
        pick = min if study_direction == StudyDirection.MINIMIZE else max
        best = pick(completed, key=lambda trial: float(trial.value))  # type: ignore[arg-type]
        replicates = [float(value) for value in best.user_attrs.get(REPLICATES_ATTR, [])]
        if len(replicates) < 2:
            return -math.inf
        return standard_error(replicates, self.folds)


@dataclass(frozen=True)
class StudyTerminator:
    """`hydra.sweeper.terminate`'s rule for one study: after `min_trials` completed trials, stop once the room for
    improvement is below the noise between replicates."""

    min_trials: int
    improvement: Evaluator
    noise: Evaluator

    def reason_to_stop(self, study: Study) -> str | None:
        """Why the study should ask no more trials (one sentence for the log and the summary), or None."""
        trials = study.get_trials(deepcopy=False)
        done = len(_completed(trials))
        if done < self.min_trials:
            return None
        noise = self.noise.evaluate(trials, study.direction)
        if not math.isfinite(noise):
            return None
        room = self.improvement.evaluate(trials, study.direction)
        if room >= noise:
            return None
        return (
            f"the study stopped after {done} completed trials: the most its best configuration could still improve "
            f"(regret bound {room:.4g}, Makarova et al. 2022) is below the noise between its replicates (standard "
            f"error {noise:.4g})"
        )


def study_terminator(
    terminate: str | None, min_trials: int, folds: int | None, seed: int | None
) -> StudyTerminator | None:
    """The terminator `hydra.sweeper.terminate` names (null: none), its settings checked by the schema
    (runner.config.schema.OptunaSweeperSettings)."""
    if terminate is None:
        return None
    return StudyTerminator(min_trials, RegretBound(seed or 0), ReplicateNoise(folds or 0))

"""How sure a sweep's comparison of configurations is: a 95% interval around each configuration's mean objective,
a paired test of each configuration against the best one over their matched replicates (the same seed and fold),
Holm-corrected across configurations, and the range each metric's interval is clipped to. Each result names the
method that made it, so that the summary and the report can say it.

Which method, and why:

- Seeds alone (no folds): the runs differ only in their initial weights and data order, so they are independent
  draws. The interval is Student's t, mean ± t(0.975, n-1)·s/√n, and the test is the paired t-test over matched
  seeds (scipy.stats.ttest_rel's statistic). From BOOTSTRAP_FROM runs on, the interval is a seeded percentile
  bootstrap instead, which assumes no normality; with fewer runs a bootstrap interval is little more than the range
  of the values (with three, exactly their range), far narrower than the mean's uncertainty.
- Folds (with or without seeds): the K folds' training sets overlap (each shares (K-2)/(K-1) of its data with any
  other), so their scores are correlated, and the plain t-test's variance s²/J understates the mean's: Bouckaert
  and Frank (Evaluating the Replicability of Significance Tests for Comparing Learning Algorithms, PAKDD 2004) show
  it calls far more differences significant than it should. Nadeau and Bengio's corrected resampled t (Inference for
  the Generalization Error, Machine Learning 52, 2003) replaces it by s²·(1/J + n_test/n_train), with
  n_test/n_train = 1/(K-1) for K-fold, over the J = seeds × folds runs: the interval is
  mean ± t(0.975, J-1)·√((1/J + 1/(K-1))·s²), and the paired test's t is mean(d)/√((1/J + 1/(K-1))·var(d)) over
  the J matched differences d, with J-1 degrees of freedom. The interval and the test use the same variance, so a
  configuration whose interval clearly leaves the best's is also the one the test calls worse.

Why the paired t-test rather than Wilcoxon's signed-rank test: a sweep has few replicates per configuration (2 to 5
seeds or folds), and the exact Wilcoxon test cannot reach p < 0.05 with fewer than six pairs (its smallest
two-sided p with five pairs is 0.0625). Pairing is what makes a few replicates enough: the seed and fold explain
much of a run's score, and the same seed and fold are shared.

Why Holm: one test per configuration against the best makes many chances to find a difference by luck; Holm's
step-down correction keeps the chance of any false "worse" at 5% for every configuration count, and is never less
powerful than Bonferroni. statsmodels has it, but is not a dependency; it is six lines."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy
from scipy import stats  # type: ignore[import-untyped]  # scipy ships no type information

LEVEL = 0.95  # the confidence of the intervals
ALPHA = 0.05  # a Holm-adjusted p below this: distinguishable from the best
BOOTSTRAP_SEED = 0  # fixed: the same runs give the same interval, and the same report, byte for byte
RESAMPLES = 9999
BOOTSTRAP_FROM = 10  # seeds alone: this many runs or more get a bootstrap interval, fewer Student's t
Replicate = TypeVar("Replicate")  # what pairs two runs: (seed, fold) in a sweep

NADEAU_BENGIO = "Nadeau & Bengio 2003"
# What a metric can be, by the last word of its name: an interval never reaches past what its mean can be.
_RANGES = {
    **dict.fromkeys(("accuracy", "auc", "f1", "fscore", "precision", "recall", "iou"), (0.0, 1.0)),
    **dict.fromkeys(("loss", "crossentropy", "error", "mae", "mse", "rmse", "mape", "msle"), (0.0, math.inf)),
    **dict.fromkeys(("parameters", "bytes", "ms", "seconds"), (0.0, math.inf)),  # what a model costs
}
_UNBOUNDED = (-math.inf, math.inf)


def metric_range(metric: str) -> tuple[float, float]:
    """The values `metric` can take, by the last word of its name (`val_accuracy` and `test_binary_accuracy`:
    [0, 1]; `test_loss` and `val_mean_absolute_error`: [0, inf); `val_f1_score`: as `f1`); an unknown name is
    unbounded."""
    words = metric.lower().removesuffix("_score").split("_")
    return _RANGES.get(words[-1], _UNBOUNDED)


@dataclass(frozen=True)
class Interval:
    """The interval of a configuration's mean over its n runs (low and high None where n < 2) and, in words, the
    method that made it: `Student-t (n=3)`, `n = 1: no interval`."""

    n: int
    method: str
    low: float | None = None
    high: float | None = None

    @property
    def bounds(self) -> tuple[float, float] | None:
        return None if self.low is None or self.high is None else (self.low, self.high)


def interval_method(n: int, folds: int = 0) -> str:
    """The interval `confidence_interval` gives n values (of a sweep with `folds` folds; 0: none), in words."""
    if n == 0:
        return "no finished run"
    if n == 1:
        return "n = 1: no interval"
    if folds >= 2:
        return f"corrected resampled t ({NADEAU_BENGIO}), n={n}, {folds} folds"
    if n >= BOOTSTRAP_FROM:
        return f"percentile bootstrap (n={n})"
    return f"Student-t (n={n})"


def confidence_interval(
    values: Sequence[float], folds: int = 0, metric: str = "", level: float = LEVEL, seed: int = BOOTSTRAP_SEED
) -> Interval:
    """The interval of the mean of `values` (the runs of one configuration of a sweep with `folds` folds; 0: seeds
    alone): the corrected resampled t with folds, else Student's t, or from BOOTSTRAP_FROM values a seeded
    percentile bootstrap; clipped to `metric`'s range. None of them for fewer than two values."""
    method = interval_method(len(values), folds)
    if len(values) < 2:
        return Interval(len(values), method)
    if max(values) == min(values):
        # Every run agrees: no spread to estimate, and the mean of equal values is rounded (mean([0.8] * 3) is
        # 0.8000000000000002), which would leave the value itself outside an interval of width zero.
        low, high = values[0], values[0]
    elif folds < 2 and len(values) >= BOOTSTRAP_FROM:
        low, high = _bootstrap(values, level, seed)
    else:
        low, high = _t_interval(values, _variance_factor(len(values), folds), level)
    return _clipped(Interval(len(values), method, float(low), float(high)), metric)


def standard_error(values: Sequence[float], folds: int = 0) -> float:
    """The standard error of the mean of `values` (one configuration's runs), with the variance the intervals use:
    s/√n for seeds alone, Nadeau and Bengio's √((1/n + 1/(K-1))·s²) with K folds. Needs two values."""
    return math.sqrt(_variance_factor(len(values), folds) * statistics.variance(values))


def _variance_factor(n: int, folds: int) -> float:
    """What the sample variance of n runs is multiplied by to give the variance of their mean: 1/n for independent
    runs; with K folds, Nadeau and Bengio's 1/n + n_test/n_train, where n_test/n_train = 1/(K-1)."""
    return 1 / n + (1 / (folds - 1) if folds >= 2 else 0.0)


def _t_interval(values: Sequence[float], factor: float, level: float) -> tuple[float, float]:
    """mean ± t((1 + level)/2, n-1)·√(factor·s²)."""

    mean = statistics.fmean(values)
    half = float(stats.t.ppf((1 + level) / 2, len(values) - 1)) * math.sqrt(factor * statistics.variance(values))
    return mean - half, mean + half


def _bootstrap(values: Sequence[float], level: float, seed: int) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean (scipy.stats.bootstrap, seeded). Percentile, not scipy's
    default BCa: BCa is undefined when most resamples repeat one value (it then returns NaN)."""

    data = numpy.asarray(values, dtype=float)
    result = stats.bootstrap(
        (data,),
        numpy.mean,
        confidence_level=level,
        n_resamples=RESAMPLES,
        method="percentile",
        rng=numpy.random.default_rng(seed),
    )
    # A mean of resampled values cannot leave [min, max], but it is rounded: ends that close to the extremes are
    # snapped onto them, so that the interval contains every value it should.
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    smallest, largest = float(data.min()), float(data.max())
    if math.isclose(low, smallest, rel_tol=1e-9) or low < smallest:
        low = smallest
    if math.isclose(high, largest, rel_tol=1e-9) or high > largest:
        high = largest
    return low, high


def _clipped(interval: Interval, metric: str) -> Interval:
    """`interval` within what `metric` can be (an accuracy's t interval can reach past 1); its method says so."""
    assert interval.low is not None and interval.high is not None
    smallest, largest = metric_range(metric)
    low, high, method = interval.low, interval.high, interval.method
    if low < smallest:
        low, method = smallest, f"{method}, clipped at {smallest:g}"
    if high > largest:
        high, method = largest, f"{method}, clipped at {largest:g}"
    return Interval(interval.n, method, low, high)


@dataclass(frozen=True)
class PairedTest:
    """One configuration against the best over their matched replicates: n pairs, the two-sided p (None when
    fewer than two pairs), then Holm's adjusted p across the configurations. `folds`: the sweep's (0: seeds alone),
    which decides the test (comparison_method)."""

    n: int
    p: float | None
    adjusted: float | None = None
    folds: int = 0

    @property
    def tested(self) -> bool:
        return self.adjusted is not None

    @property
    def distinguishable(self) -> bool:
        return self.adjusted is not None and self.adjusted < ALPHA

    @property
    def method(self) -> str:
        return comparison_method(self.folds)

    def verdict(self) -> str:
        """In words: `worse than the best (p=0.003, Holm, 3 matched runs), paired t-test`."""
        if self.adjusted is None:
            return f"not enough matched runs to test ({self.n} matched)"
        words = "worse than the best" if self.distinguishable else "indistinguishable from the best"
        return f"{words} (p={_p(self.adjusted)}, Holm, {self.n} matched runs), {self.method}"


def comparison_method(folds: int) -> str:
    """The paired test of a sweep with `folds` folds (0: seeds alone), in words."""
    return f"corrected paired t-test ({NADEAU_BENGIO})" if folds >= 2 else "paired t-test"


def _p(value: float) -> str:
    return f"{value:.2g}" if value < 0.001 else f"{value:.3f}".rstrip("0").rstrip(".") if value < 1 else "1"


def paired_p(best: Mapping[Replicate, float], other: Mapping[Replicate, float], folds: int = 0) -> PairedTest:
    """The two-sided paired t-test of `other` against `best` over the replicate keys (seed, fold) both have: with
    folds, Nadeau and Bengio's corrected one; seeds alone, the plain one (scipy.stats.ttest_rel's)."""

    keys = sorted(set(best) & set(other), key=str)
    if len(keys) < 2:
        return PairedTest(len(keys), None, folds=folds)
    differences = [other[key] - best[key] for key in keys]
    if max(differences) - min(differences) <= 1e-12:
        # No spread in the differences (but rounding): the t statistic is 0/0 (identical runs) or infinite (a
        # constant gap).
        return PairedTest(len(keys), 1.0 if abs(differences[0]) <= 1e-12 else 0.0, folds=folds)
    spread = math.sqrt(_variance_factor(len(keys), folds) * statistics.variance(differences))
    t = statistics.fmean(differences) / spread
    return PairedTest(len(keys), float(2 * stats.t.sf(abs(t), len(keys) - 1)), folds=folds)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the k-th smallest of m is multiplied by (m - k + 1),
    kept at least as large as the one before it, and capped at 1."""
    order = sorted(range(len(p_values)), key=lambda index: p_values[index])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def compare_with_best(
    best: Mapping[Replicate, float], others: Mapping[str, Mapping[Replicate, float]], folds: int = 0
) -> dict[str, PairedTest]:
    """Each of `others` (a configuration's objective per replicate key) tested against `best` (in a sweep with
    `folds` folds; 0: seeds alone), Holm-corrected over those with enough matched replicates to test."""
    tests = {name: paired_p(best, values, folds) for name, values in others.items()}
    tested = [name for name, test in tests.items() if test.p is not None]
    for name, adjusted in zip(tested, holm([tests[name].p or 0.0 for name in tested]), strict=True):
        tests[name] = PairedTest(tests[name].n, tests[name].p, adjusted, folds)
    return tests

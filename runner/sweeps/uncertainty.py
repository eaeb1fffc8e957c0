"""How sure a sweep's comparison of configurations is: a seeded bootstrap interval around each configuration's mean
objective, and a paired test of each configuration against the best one over their matched replicates (the same seed
and fold), Holm-corrected across configurations.

Why a paired t-test (scipy.stats.ttest_rel) rather than Wilcoxon's signed-rank test: a sweep has few replicates
per configuration (2 to 5 seeds or folds), and the exact Wilcoxon test cannot reach p < 0.05 with fewer than six
pairs (its smallest two-sided p with five pairs is 0.0625), so it would call every configuration indistinguishable.
The paired t-test can, at the price of assuming the paired differences are roughly normal. Pairing is what makes a
few replicates enough: the seed and fold explain much of a run's score, and the same seed and fold are shared.

Why Holm: one test per configuration against the best makes many chances to find a difference by luck; Holm's
step-down correction keeps the chance of any false "worse" at 5% for every configuration count, and is never less
powerful than Bonferroni. statsmodels has it, but is not a dependency; it is six lines."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

LEVEL = 0.95  # the confidence of the intervals
ALPHA = 0.05  # a Holm-adjusted p below this: distinguishable from the best
BOOTSTRAP_SEED = 0  # fixed: the same runs give the same interval, and the same report, byte for byte
RESAMPLES = 9999
Replicate = TypeVar("Replicate")  # what pairs two runs: (seed, fold) in a sweep


def confidence_interval(
    values: Sequence[float], level: float = LEVEL, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float] | None:
    """The percentile bootstrap interval of the mean of `values` (scipy.stats.bootstrap, seeded); None for fewer
    than two values. Percentile, not scipy's default BCa: BCa is undefined when every value is the same (it then
    returns NaN), which identical replicates make common; the percentile interval is then that value."""
    import numpy
    from scipy import stats  # type: ignore[import-untyped]  # scipy ships no type information

    if len(values) < 2:
        return None
    data = numpy.asarray(values, dtype=float)
    if numpy.all(data == data[0]):
        return float(data[0]), float(data[0])
    result = stats.bootstrap(
        (data,),
        numpy.mean,
        confidence_level=level,
        n_resamples=RESAMPLES,
        method="percentile",
        rng=numpy.random.default_rng(seed),
    )
    # A mean of resampled values cannot leave [min, max], and where enough resamples repeat one value the interval
    # ends exactly there; but the mean of n equal values is rounded (mean([0.8] * 3) == 0.8000000000000002). Ends
    # that close to the extremes are snapped onto them, so that the interval contains every value it should.
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    smallest, largest = float(data.min()), float(data.max())
    if math.isclose(low, smallest, rel_tol=1e-9) or low < smallest:
        low = smallest
    if math.isclose(high, largest, rel_tol=1e-9) or high > largest:
        high = largest
    return low, high


@dataclass(frozen=True)
class PairedTest:
    """One configuration against the best over their matched replicates: n pairs, the two-sided p (None when
    fewer than two pairs), then Holm's adjusted p across the configurations."""

    n: int
    p: float | None
    adjusted: float | None = None

    @property
    def tested(self) -> bool:
        return self.adjusted is not None

    @property
    def distinguishable(self) -> bool:
        return self.adjusted is not None and self.adjusted < ALPHA

    def verdict(self) -> str:
        """In words: `worse than the best (p=0.003, Holm)`."""
        if self.adjusted is None:
            return f"not enough matched runs to test ({self.n} matched)"
        words = "worse than the best" if self.distinguishable else "indistinguishable from the best"
        return f"{words} (p={_p(self.adjusted)}, Holm, {self.n} matched runs)"


def _p(value: float) -> str:
    return f"{value:.2g}" if value < 0.001 else f"{value:.3f}".rstrip("0").rstrip(".") if value < 1 else "1"


def paired_p(best: Mapping[Replicate, float], other: Mapping[Replicate, float]) -> PairedTest:
    """The two-sided paired t-test of `other` against `best` over the replicate keys (seed, fold) both have."""
    from scipy import stats

    keys = sorted(set(best) & set(other), key=str)
    if len(keys) < 2:
        return PairedTest(len(keys), None)
    differences = [other[key] - best[key] for key in keys]
    if max(differences) - min(differences) <= 1e-12:
        # No spread in the differences (but rounding): the t statistic is 0/0 (identical runs) or infinite (a
        # constant gap), which scipy answers with NaN or a warning about catastrophic cancellation.
        return PairedTest(len(keys), 1.0 if abs(differences[0]) <= 1e-12 else 0.0)
    result = stats.ttest_rel([other[key] for key in keys], [best[key] for key in keys])
    p = float(result.pvalue)
    return PairedTest(len(keys), 1.0 if math.isnan(p) else p)


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
    best: Mapping[Replicate, float], others: Mapping[str, Mapping[Replicate, float]]
) -> dict[str, PairedTest]:
    """Each of `others` (a configuration's objective per replicate key) tested against `best`, Holm-corrected over
    those with enough matched replicates to test."""
    tests = {name: paired_p(best, values) for name, values in others.items()}
    tested = [name for name, test in tests.items() if test.p is not None]
    for name, adjusted in zip(tested, holm([tests[name].p or 0.0 for name in tested]), strict=True):
        tests[name] = PairedTest(tests[name].n, tests[name].p, adjusted)
    return tests

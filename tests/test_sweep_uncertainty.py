"""The statistics of the sweep report (runner.sweeps.uncertainty), each against scipy computed here: Student's t
interval and the paired t-test over seeds alone, Nadeau and Bengio's corrected resampled t (interval and paired
test) wherever there are folds, a seeded percentile bootstrap from ten seeds on, intervals clipped to what the
metric can be, nothing for one run, a paired test that calls identical configurations indistinguishable and a
clearly worse one worse, and Holm's correction."""

from __future__ import annotations

import math
import statistics

import numpy
import pytest
from scipy import stats

from runner.sweeps.uncertainty import (
    BOOTSTRAP_FROM,
    BOOTSTRAP_SEED,
    RESAMPLES,
    PairedTest,
    compare_with_best,
    confidence_interval,
    holm,
    metric_range,
    paired_p,
)

BEST = [0.81, 0.84, 0.79, 0.83, 0.8]
OTHER = [0.78, 0.76, 0.7, 0.8, 0.74]


def student_t(values: list[float]) -> tuple[float, float]:
    """mean ± t(0.975, n-1)·s/√n."""
    n, mean = len(values), statistics.fmean(values)
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean - half, mean + half


def corrected_t(values: list[float], folds: int) -> tuple[float, float]:
    """mean ± t(0.975, J-1)·√((1/J + 1/(K-1))·s²) over J runs of a K-fold sweep."""
    j, mean = len(values), statistics.fmean(values)
    half = stats.t.ppf(0.975, j - 1) * math.sqrt((1 / j + 1 / (folds - 1)) * statistics.variance(values))
    return mean - half, mean + half


def corrected_paired_p(best: list[float], other: list[float], folds: int) -> float:
    """t = mean(d)/√((1/J + 1/(K-1))·var(d)), J-1 degrees of freedom, two-sided."""
    d = [o - b for o, b in zip(other, best, strict=True)]
    t = statistics.fmean(d) / math.sqrt((1 / len(d) + 1 / (folds - 1)) * statistics.variance(d))
    return float(2 * stats.t.sf(abs(t), len(d) - 1))


@pytest.mark.parametrize("n", [2, 3, 5])
def test_seeds_alone_get_students_t_interval_and_the_paired_t_test(n):
    interval = confidence_interval(OTHER[:n])
    assert interval.bounds == pytest.approx(student_t(OTHER[:n]), abs=1e-4)
    assert interval.method == f"Student-t (n={n})"
    seeds = {(str(seed), ""): value for seed, value in enumerate(BEST[:n])}
    other = {(str(seed), ""): value for seed, value in enumerate(OTHER[:n])}
    test = paired_p(seeds, other)
    assert test.p == pytest.approx(stats.ttest_rel(OTHER[:n], BEST[:n]).pvalue, abs=1e-4)
    assert test.method == "paired t-test"


@pytest.mark.parametrize("n", [2, 3, 5])
def test_folds_get_the_corrected_resampled_t_interval_and_test(n):
    interval = confidence_interval(OTHER[:n], folds=n)
    assert interval.bounds == pytest.approx(corrected_t(OTHER[:n], n), abs=1e-4)
    assert interval.method == f"corrected resampled t (Nadeau & Bengio 2003), n={n}, {n} folds"
    # Wider than Student's t over the same values: the folds' overlapping training sets add variance.
    assert interval.bounds[1] - interval.bounds[0] > student_t(OTHER[:n])[1] - student_t(OTHER[:n])[0]
    best = {("42", str(fold)): value for fold, value in enumerate(BEST[:n])}
    other = {("42", str(fold)): value for fold, value in enumerate(OTHER[:n])}
    test = paired_p(best, other, folds=n)
    assert test.p == pytest.approx(corrected_paired_p(BEST[:n], OTHER[:n], n), abs=1e-4)
    assert test.p > stats.ttest_rel(OTHER[:n], BEST[:n]).pvalue  # the plain test over folds is anti-conservative
    assert test.method == "corrected paired t-test (Nadeau & Bengio 2003)"


def test_three_seeds_by_three_folds_are_nine_matched_runs_of_a_three_fold_sweep():
    """2 configurations x 3 seeds x 3 folds: J = 9 runs each, K = 3."""
    rng = numpy.random.default_rng(7)
    keys = [(str(seed), str(fold)) for seed in (42, 43, 44) for fold in range(3)]
    best = {key: float(value) for key, value in zip(keys, rng.normal(0.82, 0.02, 9), strict=True)}
    other = {key: float(value) for key, value in zip(keys, rng.normal(0.79, 0.02, 9), strict=True)}
    interval = confidence_interval(list(other.values()), folds=3, metric="val_accuracy")
    assert interval.bounds == pytest.approx(corrected_t(list(other.values()), 3), abs=1e-4)
    assert interval.method == "corrected resampled t (Nadeau & Bengio 2003), n=9, 3 folds"
    [test] = compare_with_best(best, {"other": other}, folds=3).values()
    expected = corrected_paired_p([best[key] for key in keys], [other[key] for key in keys], 3)
    assert (test.n, test.p, test.adjusted) == (9, pytest.approx(expected, abs=1e-4), pytest.approx(expected, abs=1e-4))
    assert test.verdict().endswith("9 matched runs), corrected paired t-test (Nadeau & Bengio 2003)")


def test_ten_seeds_or_more_get_the_seeded_percentile_bootstrap():
    values = [0.71, 0.74, 0.69, 0.8, 0.77, 0.73, 0.75, 0.7, 0.72, 0.76, 0.78, 0.74]
    assert len(values) >= BOOTSTRAP_FROM
    interval = confidence_interval(values)
    expected = stats.bootstrap(
        (numpy.asarray(values),),
        numpy.mean,
        confidence_level=0.95,
        n_resamples=RESAMPLES,
        method="percentile",
        rng=numpy.random.default_rng(BOOTSTRAP_SEED),
    ).confidence_interval
    assert interval.bounds == pytest.approx((expected.low, expected.high), abs=1e-4)
    assert interval.method == f"percentile bootstrap (n={len(values)})"
    assert interval == confidence_interval(values)  # seeded: the same every time
    assert confidence_interval(values, seed=1) != interval  # the seed is what fixes it
    # Nine seeds are still Student's t; folds are the corrected t however many runs there are.
    assert confidence_interval(values[:9]).method == "Student-t (n=9)"
    assert confidence_interval(values, folds=4).bounds == pytest.approx(corrected_t(values, 4), abs=1e-4)


def test_intervals_are_clipped_to_what_the_metric_can_be_and_say_so():
    assert metric_range("val_accuracy") == metric_range("test_binary_accuracy") == (0.0, 1.0)
    assert metric_range("val_auc") == metric_range("test_f1_score") == metric_range("val_mean_iou") == (0.0, 1.0)
    assert metric_range("val_precision") == metric_range("val_recall") == (0.0, 1.0)
    assert metric_range("test_loss") == metric_range("val_mae") == metric_range("val_rmse") == (0.0, math.inf)
    assert metric_range("val_mean_absolute_error") == (0.0, math.inf)
    assert metric_range("examples_per_second") == metric_range("val_r2_score") == (-math.inf, math.inf)

    high = [0.95, 0.99, 0.97]
    interval = confidence_interval(high, metric="val_accuracy")
    assert interval.bounds == pytest.approx((student_t(high)[0], 1.0), abs=1e-4)
    assert interval.method == "Student-t (n=3), clipped at 1"
    low = [0.01, 0.2, 0.05]
    interval = confidence_interval(low, folds=3, metric="test_loss")
    assert interval.bounds == pytest.approx((0.0, corrected_t(low, 3)[1]), abs=1e-4)
    assert interval.method.endswith(", clipped at 0")
    assert confidence_interval(low, metric="learning_rate").bounds == pytest.approx(student_t(low), abs=1e-4)
    assert confidence_interval([0.4, 0.9], metric="val_accuracy").bounds == (0.0, 1.0)  # clipped at both ends


def test_one_run_has_no_interval_and_no_test_and_agreeing_runs_an_interval_of_their_value():
    assert confidence_interval([0.9], folds=3) == confidence_interval([0.9])
    one = confidence_interval([0.9])
    assert (one.bounds, one.method) == (None, "n = 1: no interval")
    assert confidence_interval([]).bounds is None
    assert paired_p({("42", "0"): 0.9}, {("42", "0"): 0.8}).verdict() == "not enough matched runs to test (1 matched)"
    for folds in (0, 3):
        assert confidence_interval([0.8, 0.8, 0.8], folds=folds).bounds == (0.8, 0.8)


def test_identical_configurations_are_indistinguishable_and_a_clearly_worse_one_is_worse_after_holm():
    best = {("42", "0"): 0.81, ("42", "1"): 0.84, ("42", "2"): 0.79}
    tests = compare_with_best(
        best,
        {
            "the same values": dict(best),
            "much worse": {("42", "0"): 0.31, ("42", "1"): 0.35, ("42", "2"): 0.28},
            "slightly noisier": {("42", "0"): 0.80, ("42", "1"): 0.85, ("42", "2"): 0.77},
            "one matched run": {("42", "0"): 0.2, ("7", "0"): 0.2},
        },
        folds=3,
    )
    assert tests["the same values"].verdict().startswith("indistinguishable from the best (p=1, Holm")
    assert tests["much worse"].distinguishable and tests["much worse"].verdict().startswith("worse than the best (p=")
    assert tests["much worse"].adjusted > tests["much worse"].p  # corrected for the three tested
    assert not tests["slightly noisier"].distinguishable
    assert tests["one matched run"] == PairedTest(1, None, folds=3)
    assert tests["one matched run"].verdict().startswith("not enough matched runs to test")


def test_a_constant_gap_over_every_pair_is_a_difference_and_unmatched_runs_are_not_paired():
    for folds in (0, 3):
        assert paired_p({1: 0.9, 2: 0.8}, {1: 0.8, 2: 0.7}, folds).p == 0.0
        assert paired_p({1: 0.9, 2: 0.8}, {1: 0.9, 2: 0.8}, folds).p == 1.0
    assert paired_p({1: 0.9, 2: 0.8}, {3: 0.1, 4: 0.1}) == PairedTest(0, None)


def test_holm_multiplies_the_kth_smallest_by_the_number_left_and_keeps_the_order():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == [1.0, 1.0]
    assert holm([]) == []

"""The statistics of the sweep report (runner.sweeps.uncertainty): intervals that contain agreeing values and are
the same every time, a paired test that calls identical configurations indistinguishable and a clearly worse one
worse, and Holm's correction."""

from __future__ import annotations

import pytest

from runner.sweeps.uncertainty import PairedTest, compare_with_best, confidence_interval, holm, paired_p


def test_an_interval_contains_every_value_when_the_replicates_agree():
    assert confidence_interval([0.8, 0.8, 0.8]) == (0.8, 0.8)
    for values in ([0.5, 0.6], [0.8, 0.82, 0.81], [0.1, 0.7, 0.7]):
        low, high = confidence_interval(values)
        # Two or three replicates: a resample of one value repeated is more than 2.5% likely, so the ends are them.
        assert (low, high) == (min(values), max(values)), values
    assert confidence_interval([0.9]) is None  # one run has no interval


def test_a_seeded_bootstrap_gives_the_same_interval_every_time_and_narrows_with_more_runs():
    values = [0.71, 0.74, 0.69, 0.8, 0.77, 0.73, 0.75, 0.7]
    first = confidence_interval(values)
    assert first == confidence_interval(values)
    assert min(values) < first[0] < sum(values) / len(values) < first[1] < max(values)
    assert confidence_interval(values, seed=1) != first  # the seed is what fixes it


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
    )
    assert tests["the same values"].verdict().startswith("indistinguishable from the best (p=1, Holm")
    assert tests["much worse"].distinguishable and tests["much worse"].verdict().startswith("worse than the best (p=")
    assert tests["much worse"].adjusted > tests["much worse"].p  # corrected for the three tested
    assert not tests["slightly noisier"].distinguishable
    assert tests["one matched run"] == PairedTest(1, None)
    assert tests["one matched run"].verdict().startswith("not enough matched runs to test")


def test_a_constant_gap_over_every_pair_is_a_difference_and_unmatched_runs_are_not_paired():
    assert paired_p({1: 0.9, 2: 0.8}, {1: 0.8, 2: 0.7}).p == 0.0
    assert paired_p({1: 0.9, 2: 0.8}, {3: 0.1, 4: 0.1}) == PairedTest(0, None)


def test_holm_multiplies_the_kth_smallest_by_the_number_left_and_keeps_the_order():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == [1.0, 1.0]
    assert holm([]) == []

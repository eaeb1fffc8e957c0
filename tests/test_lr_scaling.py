"""The effective learning rate for a global batch, and the warm-up ramp."""

from __future__ import annotations

import math

import pytest

from runner.config.schema import LrScalingSettings
from runner.training.lr_scaling import WARMUP_START_FRACTION, LinearWarmup, effective_learning_rate, warmup_steps


@pytest.mark.parametrize(
    "rule,global_batch,expected",
    [
        ("none", 256, 0.001),
        ("linear", 256, 0.004),
        ("linear", 32, 0.0005),
        ("sqrt", 256, 0.002),
        ("sqrt", 128, 0.001 * math.sqrt(2)),
    ],
)
def test_effective_learning_rate(rule, global_batch, expected):
    settings = LrScalingSettings(rule=rule, base_batch=64, warmup_epochs=0)
    assert effective_learning_rate(0.001, global_batch, settings) == pytest.approx(expected)


def test_warmup_ramps_linearly_then_holds():
    assert warmup_steps(steps_per_epoch=10, settings=LrScalingSettings("linear", 64, 2)) == 20
    schedule = LinearWarmup(0.004, 20)
    start = 0.004 * WARMUP_START_FRACTION
    assert float(schedule(0)) == pytest.approx(start)
    assert float(schedule(10)) == pytest.approx(start + (0.004 - start) / 2)
    assert float(schedule(20)) == pytest.approx(0.004)
    assert float(schedule(500)) == pytest.approx(0.004)


def test_no_warmup_has_no_steps():
    assert warmup_steps(10, LrScalingSettings("sqrt", 64, 0)) == 0

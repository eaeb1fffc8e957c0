"""The effective learning rate for a global batch (none, linear, sqrt), with an optional linear warm-up."""

from __future__ import annotations

import math

import tensorflow as tf

from runner.settings import LrScalingSettings

WARMUP_START_FRACTION = 0.01


def effective_learning_rate(base_lr: float, global_batch: int, settings: LrScalingSettings) -> float:
    ratio = global_batch / settings.base_batch
    factor = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[settings.rule]
    return base_lr * factor


class LinearWarmup(tf.keras.optimizers.schedules.LearningRateSchedule):
    """Ramp linearly from WARMUP_START_FRACTION x target to target over `warmup_steps`, then hold."""

    def __init__(self, target: float, warmup_steps: int):
        self.target = float(target)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step):
        progress = tf.minimum(tf.cast(step, tf.float32) / float(self.warmup_steps), 1.0)
        start = self.target * WARMUP_START_FRACTION
        return start + (self.target - start) * progress

    def get_config(self):
        return {"target": self.target, "warmup_steps": self.warmup_steps}


def learning_rate(target: float, steps_per_epoch: int, settings: LrScalingSettings):
    """A float, or a warm-up schedule when settings.warmup_epochs > 0."""
    warmup_steps = round(settings.warmup_epochs * steps_per_epoch)
    return LinearWarmup(target, warmup_steps) if warmup_steps > 0 else target

"""The effective learning rate for a global batch (none, linear, sqrt), with an optional linear warm-up."""

from __future__ import annotations

import functools
import math

import tensorflow as tf

from runner.config.schema import LrScalingSettings

WARMUP_START_FRACTION = 0.01


def effective_learning_rate(base_lr: float, global_batch: int, settings: LrScalingSettings) -> float:
    ratio = global_batch / settings.base_batch
    factor = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[settings.rule]
    return base_lr * factor


class _Warmup:
    """Ramp linearly from WARMUP_START_FRACTION x target to target over `warmup_steps`, then hold; `target` is
    a rate or a schedule (runner.builtins.schedules), whose rate at each step is the one ramped up."""

    _schedules = tf.keras.optimizers.schedules  # the Keras whose schedules serialize the target

    def __init__(self, target, warmup_steps: int):
        self.target = target if callable(target) else float(target)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step):
        progress = tf.minimum(tf.cast(step, tf.float32) / float(self.warmup_steps), 1.0)
        target = self.target(step) if callable(self.target) else self.target
        start = target * WARMUP_START_FRACTION
        return start + (target - start) * progress

    def get_config(self):
        target = self.target
        if isinstance(target, self._schedules.LearningRateSchedule):
            target = self._schedules.serialize(target)
        return {"target": target, "warmup_steps": self.warmup_steps}


class LinearWarmup(_Warmup, tf.keras.optimizers.schedules.LearningRateSchedule):
    """The warm-up as a tf_keras schedule."""


@functools.cache
def _keras3_warmup() -> type:
    """The warm-up as a Keras 3 schedule (a Keras 3 optimizer calls only its own Keras's schedules with the step)."""
    import keras  # noqa: PLC0415  Keras 3: only for a Keras 3 run, a tf_keras run never loads it

    return type(
        "Keras3LinearWarmup",
        (_Warmup, keras.optimizers.schedules.LearningRateSchedule),
        {
            "_schedules": keras.optimizers.schedules,
            "__doc__": "The warm-up as a Keras 3 schedule.",
        },
    )


def linear_warmup(target, warmup_steps: int, keras: int = 2):
    """The warm-up over `target` as a schedule of Keras `keras` (2: tf_keras, 3: Keras 3)."""
    return (_keras3_warmup() if keras == 3 else LinearWarmup)(target, warmup_steps)


def warmup_steps(steps_per_epoch: int, settings: LrScalingSettings) -> int:
    """The steps of lr_scaling's linear warm-up (0: none)."""
    return round(settings.warmup_epochs * steps_per_epoch)

"""The optimizer, built with its variables before the first step (as the strategies need), and its current rate."""

from __future__ import annotations

import tensorflow as tf


def prepare_optimizer(
    optimizer: tf.keras.optimizers.Optimizer, variables, loss_scaling: bool = False
) -> tf.keras.optimizers.Optimizer:
    """The task's optimizer, wrapped in a dynamic LossScaleOptimizer when float16 gradients need loss scaling,
    with its slot variables built before the first step (as the strategies need)."""
    if loss_scaling:
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    optimizer.build(variables)
    return optimizer


def current_learning_rate(optimizer: tf.keras.optimizers.Optimizer) -> float:
    rate = optimizer.learning_rate
    if isinstance(rate, tf.keras.optimizers.schedules.LearningRateSchedule):
        rate = rate(optimizer.iterations)
    return float(tf.keras.backend.get_value(rate))

"""The optimizer, built with its variables before the first step (as the strategies need)."""

from __future__ import annotations

import tensorflow as tf

from runner.settings import OptimizerSettings


def build_optimizer(settings: OptimizerSettings, learning_rate, variables,
                    loss_scaling: bool = False) -> tf.keras.optimizers.Optimizer:
    """Adam, wrapped in a dynamic LossScaleOptimizer when float16 gradients need loss scaling."""
    optimizer = tf.keras.optimizers.Adam(learning_rate=learning_rate)
    if loss_scaling:
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    optimizer.build(variables)
    return optimizer


def current_learning_rate(optimizer: tf.keras.optimizers.Optimizer) -> float:
    rate = optimizer.learning_rate
    if isinstance(rate, tf.keras.optimizers.schedules.LearningRateSchedule):
        rate = rate(optimizer.iterations)
    return float(tf.keras.backend.get_value(rate))

"""The optimizer, built with its variables before the first step (as the strategies need), its loss scaling under
float16, and its current rate: in the Keras of the model (tf_keras or Keras 3, runner.builtins.keras_lane)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from runner.builtins import keras_lane


def prepare_optimizer(optimizer, variables, loss_scaling: bool = False):
    """The task's optimizer, wrapped in its Keras's dynamic LossScaleOptimizer when float16 gradients need loss
    scaling, with its slot variables built before the first step (as the strategies need)."""
    if loss_scaling:
        optimizer = keras_lane.api(keras_lane.version_of(optimizer)).mixed_precision.LossScaleOptimizer(optimizer)
    optimizer.build(variables)
    return optimizer


class LossScaling:
    """How a LossScaleOptimizer scales the loss up (float16 gradients underflow) and its gradients back down.

    tf_keras: get_scaled_loss and get_unscaled_gradients. Keras 3 (keras #19479): scale_loss, and its
    apply_gradients unscales the gradients itself (skipping a step whose gradients are not finite)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.keras3 = keras_lane.version_of(optimizer) == 3

    @staticmethod
    def of(optimizer) -> LossScaling | None:
        """The optimizer's loss scaling, None for an optimizer that does not scale."""
        version = keras_lane.version_of(optimizer)
        if version is None or not isinstance(optimizer, keras_lane.api(version).mixed_precision.LossScaleOptimizer):
            return None
        return LossScaling(optimizer)

    def scaled_loss(self, loss):
        return self.optimizer.scale_loss(loss) if self.keras3 else self.optimizer.get_scaled_loss(loss)

    def unscaled_gradients(self, gradients):
        return gradients if self.keras3 else self.optimizer.get_unscaled_gradients(gradients)


def current_learning_rate(optimizer) -> float:
    rate = optimizer.learning_rate  # Keras 3: the current rate; tf_keras: the rate or its schedule
    if isinstance(rate, tf.keras.optimizers.schedules.LearningRateSchedule):
        rate = rate(optimizer.iterations)
    if keras_lane.version_of(optimizer) == 3:
        return float(np.asarray(rate))
    return float(tf.keras.backend.get_value(rate))

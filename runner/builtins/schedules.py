"""The built-in learning-rate schedules, called as build(learning_rate=..., total_steps=..., **arguments) with
the effective rate (optimizer.lr scaled by lr_scaling) and the run's steps (epochs x steps per epoch). They
return a rate or a LearningRateSchedule of the model's Keras (runner.builtins.keras_lane); lr_scaling's warm-up,
when on, ramps up whatever they return."""

from __future__ import annotations

from runner.builtins.keras_lane import api


def constant(learning_rate: float, total_steps: int) -> float:
    return learning_rate


def cosine(learning_rate: float, total_steps: int, alpha: float = 0.0):
    """From learning_rate down to alpha x learning_rate along half a cosine over the run's steps."""
    return api().optimizers.schedules.CosineDecay(learning_rate, decay_steps=total_steps, alpha=alpha)

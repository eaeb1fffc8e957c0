"""The built-in optimizers, called as build(learning_rate=..., **their config arguments). The learning rate is
the effective one: optimizer.lr scaled by lr_scaling and shaped by the schedule. Each is an optimizer of the
model's Keras (runner.builtins.keras_lane)."""

from __future__ import annotations

from runner.builtins.keras_lane import api


def adam(learning_rate, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7, amsgrad: bool = False):
    return api().optimizers.Adam(
        learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, amsgrad=amsgrad
    )


def sgd(learning_rate, momentum: float = 0.0, nesterov: bool = False):
    return api().optimizers.SGD(learning_rate=learning_rate, momentum=momentum, nesterov=nesterov)


def adamw(
    learning_rate,
    weight_decay: float = 0.004,
    beta_1: float = 0.9,
    beta_2: float = 0.999,
    epsilon: float = 1e-7,
    amsgrad: bool = False,
):
    """Adam with weight decay decoupled from the gradient (Loshchilov and Hutter)."""
    return api().optimizers.AdamW(
        learning_rate=learning_rate,
        weight_decay=weight_decay,
        beta_1=beta_1,
        beta_2=beta_2,
        epsilon=epsilon,
        amsgrad=amsgrad,
    )

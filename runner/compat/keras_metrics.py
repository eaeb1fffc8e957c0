"""Keras metrics that create their state on their first update, from the shape of what they are given: the
F-scores (F1Score, FBetaScore) of tf_keras and Keras 3, and AUC(multi_label=True) without num_labels. Inside the
replica step that first update would create variables in a replica context, which tf.distribute refuses; the
runner creates their state in strategy.scope() instead, from the model's output shape, through the method the
metric's own first update calls (tf_keras's FBetaScore.build is public, the others' `_build` is not).
"""

from __future__ import annotations

import inspect
from typing import Any

import tensorflow as tf


def build_for_outputs(metric: Any, outputs: tuple[int, ...]) -> None:
    """Create `metric`'s state now for labels and model outputs shaped (batch, *outputs), where it would create it
    on its first update; a metric whose state already exists is left as it is."""
    if getattr(metric, "_built", True) is False and callable(getattr(metric, "_build", None)):
        build = metric._build  # AUC(multi_label=True), Keras 3's FBetaScore
    elif getattr(metric, "built", True) is False and "y_pred_shape" in _parameters(getattr(metric, "build", None)):
        build = metric.build  # tf_keras's FBetaScore
    else:
        return
    shape = tf.TensorShape((None, *outputs))
    build(*[shape] * len(_parameters(build)))


def _parameters(function: Any) -> list[str]:
    try:
        return list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return []

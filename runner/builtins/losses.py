"""The built-in losses: loss(labels, logits, **arguments) gives one loss per example; the runner averages them
over the global batch (tf.nn.compute_average_loss) and adds the model's scaled regularization losses. Each is
the loss of the model's Keras (runner.builtins.keras_lane)."""

from __future__ import annotations

from runner.builtins.keras_lane import api, selected


def sparse_categorical_crossentropy(labels, logits):
    """The tutorial's loss: cross-entropy of integer class labels against logits."""
    keras = api()
    # Keras 3 names "no reduction" None; tf_keras, Reduction.NONE.
    reduction = None if selected() == 3 else keras.losses.Reduction.NONE
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
    return loss(labels, logits)

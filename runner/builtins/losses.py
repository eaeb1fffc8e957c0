"""The built-in losses: loss(labels, logits, **arguments) gives one loss per example; the runner averages them
over the global batch (tf.nn.compute_average_loss) and adds the model's scaled regularization losses."""

from __future__ import annotations


def sparse_categorical_crossentropy(labels, logits):
    """The tutorial's loss: cross-entropy of integer class labels against logits."""
    import tensorflow as tf  # TensorFlow when called: its signature is checked before TF loads

    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
    return loss(labels, logits)

"""The built-in losses, one per task (conf/task/): loss(labels, logits, **arguments) gives one loss per example; the
runner averages them over the global batch (tf.nn.compute_average_loss) and adds the model's scaled regularization
losses. The tutorial's cross-entropy is the loss of the model's Keras (runner.builtins.keras_lane); the others are
TensorFlow's own maths, the same for either Keras."""

from __future__ import annotations

from runner.builtins.keras_lane import api, selected


def sparse_categorical_crossentropy(labels, logits):
    """The tutorial's loss: cross-entropy of integer class labels against logits."""
    keras = api()
    # Keras 3 names "no reduction" None; tf_keras, Reduction.NONE.
    reduction = None if selected() == 3 else keras.losses.Reduction.NONE
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
    return loss(labels, logits)


def mean_squared_error(labels, outputs):
    """Regression's loss: the squared error of each of an example's outputs, averaged over them (labels shaped as
    the outputs are: runner.task_kinds), in float32 whatever the mixed-precision policy."""
    import tensorflow as tf  # noqa: PLC0415  the config's checks import this module in a process without TensorFlow

    errors = tf.square(tf.cast(outputs, tf.float32) - tf.cast(labels, tf.float32))
    return _per_example(errors)


def binary_crossentropy(labels, logits):
    """Binary and multi-label loss: the sigmoid cross-entropy of each 0/1 label against its logit, averaged over an
    example's labels, in float32."""
    import tensorflow as tf  # noqa: PLC0415  the config's checks import this module in a process without TensorFlow

    losses = tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.float32), logits=tf.cast(logits, tf.float32)
    )
    return _per_example(losses)


def _per_example(values):
    """One value per example: the mean over every axis but the batch's."""
    import tensorflow as tf  # noqa: PLC0415  the config's checks import this module in a process without TensorFlow

    return tf.reduce_mean(tf.reshape(values, (tf.shape(values)[0], -1)), axis=1)

"""mylab's models. The runner calls a model option's `_target_` as
build(input_shape=..., num_classes=..., **the option's other keys) inside strategy.scope(), and trains
the tf_keras model it returns, which must output logits (no softmax: the runner's loss takes logits, and
the logged model adds the softmax itself); under task=regression it outputs the values, num_classes of them
(the target's size per example, 1 for the diabetes data).
"""

from __future__ import annotations

from collections.abc import Sequence

# Keras 2 (tf_keras), which every strategy trains: `import keras` is Keras 3, which the runner trains under
# default, one_device and mirrored only (mylab/keras3_models.py). `import tf_keras as keras` is Keras 2 wherever
# this module is imported (the runner, a notebook, a test); `from tensorflow import keras` is too, but only where
# TF_USE_LEGACY_KERAS=1 was set before TensorFlow was imported (the runner sets it).
import tf_keras as keras


def mlp(input_shape: Sequence[int], num_classes: int, hidden: int = 128, weight_decay: float = 0.0):
    """A multi-layer perceptron: the image flattened, one hidden ReLU layer of `hidden` units, logits.

    `weight_decay` (L2 on the kernels) is accepted even at 0: swapping the default cnn option's `_target_`
    on the command line keeps that option's other keys (`model._target_=mylab.models.mlp +model.hidden=256`
    still passes the cnn's weight_decay), and a callable without it would be refused."""
    regularizer = keras.regularizers.L2(weight_decay) if weight_decay else None
    model = keras.Sequential(
        [
            keras.layers.Flatten(),
            keras.layers.Dense(hidden, activation="relu", kernel_regularizer=regularizer),
            # float32 logits whatever runtime.mixed_precision says, so the loss is computed in float32.
            keras.layers.Dense(num_classes, kernel_regularizer=regularizer, dtype="float32"),
        ],
        name="mlp",
    )
    model.build((None, *input_shape))  # its variables now, inside the strategy's scope
    return model

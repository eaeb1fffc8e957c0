"""mylab's models in Keras 3 (`import keras`): the same MLP as mylab/models.py, for `model=my_mlp_keras3`.

The runner trains a Keras 3 model under strategy=default, one_device and mirrored, and refuses it with one
paragraph under multi_worker_mirrored (keras #20585), parameter_server (keras #18624), central_storage and tpu;
the built-in optimizers, schedules and loss follow the model's Keras."""

from __future__ import annotations

from collections.abc import Sequence

import keras


def mlp(input_shape: Sequence[int], num_classes: int, hidden: int = 128, weight_decay: float = 0.0):
    """A multi-layer perceptron: the image flattened, one hidden ReLU layer of `hidden` units, logits."""
    regularizer = keras.regularizers.L2(weight_decay) if weight_decay else None
    inputs = keras.Input(shape=tuple(input_shape))
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(hidden, activation="relu", kernel_regularizer=regularizer)(x)
    # float32 logits whatever runtime.mixed_precision says, so the loss is computed in float32.
    logits = keras.layers.Dense(num_classes, kernel_regularizer=regularizer, dtype="float32")(x)
    return keras.Model(inputs, logits, name="mlp")

"""The built-in models. Each is called as build(input_shape=..., num_classes=..., **its config arguments)
inside strategy.scope() and returns a model that outputs logits (float32 under any precision), in the Keras that
runtime.keras selects (runner.builtins.keras_lane: tf_keras by default, or Keras 3)."""

from __future__ import annotations

from collections.abc import Sequence

from runner.builtins.keras_lane import api


def cnn(input_shape: Sequence[int], num_classes: int, weight_decay: float = 1e-5, dense_units: int = 64):
    """The tutorial's CNN: two 3x3 conv layers with max pooling, dense 64 (`dense_units`: the width a sweep can trade
    against accuracy), dense logits; L2 on the kernels."""
    keras = api()
    regularizer = keras.regularizers.L2(weight_decay) if weight_decay else None
    model = keras.Sequential(
        [
            keras.layers.Conv2D(32, 3, activation="relu", kernel_regularizer=regularizer),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu", kernel_regularizer=regularizer),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(dense_units, activation="relu", kernel_regularizer=regularizer),
            # Logits stay float32 under a mixed-precision policy, so the loss is computed in float32.
            keras.layers.Dense(num_classes, kernel_regularizer=regularizer, dtype="float32"),
        ]
    )
    model.build((None, *input_shape))
    return model


def resnet(
    input_shape: Sequence[int],
    num_classes: int,
    widths: Sequence[int] = (16, 32, 64),
    blocks_per_stage: int = 2,
    weight_decay: float = 1e-4,
):
    """A small ResNet (He et al.'s CIFAR layout): a 3x3 conv stem, one stage of `blocks_per_stage` residual
    blocks per width (each stage after the first halves the resolution), global average pooling, logits."""
    keras = api()
    layers = keras.layers
    regularizer = keras.regularizers.L2(weight_decay) if weight_decay else None

    def conv(filters: int, size: int, strides: int = 1):
        return layers.Conv2D(
            filters, size, strides=strides, padding="same", use_bias=False, kernel_regularizer=regularizer
        )

    def block(x, filters: int, strides: int):
        shortcut = x
        y = layers.ReLU()(layers.BatchNormalization()(conv(filters, 3, strides)(x)))
        y = layers.BatchNormalization()(conv(filters, 3)(y))
        if strides != 1 or x.shape[-1] != filters:
            shortcut = layers.BatchNormalization()(conv(filters, 1, strides)(x))
        return layers.ReLU()(layers.Add()([y, shortcut]))

    inputs = keras.Input(shape=tuple(input_shape))
    x = layers.ReLU()(layers.BatchNormalization()(conv(widths[0], 3)(inputs)))
    for stage, filters in enumerate(widths):
        for index in range(blocks_per_stage):
            x = block(x, filters, 2 if stage > 0 and index == 0 else 1)
    x = layers.GlobalAveragePooling2D()(x)
    logits = layers.Dense(num_classes, kernel_regularizer=regularizer, dtype="float32")(x)
    return keras.Model(inputs, logits, name="resnet")

"""The tutorial's CNN for 28x28x1 images: two conv layers with pooling, dense 64, dense 10 logits."""

from __future__ import annotations

import tensorflow as tf

from runner.training.data import IMAGE_SHAPE, NUM_CLASSES
from runner.settings import ModelSettings


def build_model(settings: ModelSettings) -> tf.keras.Model:
    regularizer = tf.keras.regularizers.L2(settings.weight_decay) if settings.weight_decay else None
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Conv2D(32, 3, activation="relu", kernel_regularizer=regularizer),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(64, 3, activation="relu", kernel_regularizer=regularizer),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu", kernel_regularizer=regularizer),
            # Logits stay float32 under a mixed-precision policy, so the loss is computed in float32.
            tf.keras.layers.Dense(NUM_CLASSES, kernel_regularizer=regularizer, dtype="float32"),
        ]
    )
    model.build((None, *IMAGE_SHAPE))
    return model

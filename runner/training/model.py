"""The tutorial's CNN for 28x28x1 images: two conv layers with pooling, dense 64, dense 10 logits; and the
same network taking raw images and returning probabilities, as it is exported."""

from __future__ import annotations

import tensorflow as tf

from runner.training.data import IMAGE_SHAPE, NUM_CLASSES, PIXEL_MAX
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


def with_raw_image_input(cnn: tf.keras.Model) -> tf.keras.Model:
    """`cnn` (its weights shared, not copied) behind what runner.training.data does to pixels, with a softmax
    on its logits: raw images (n, 28, 28), values 0-255, in; the 10 class probabilities out.

    Normalization with mean 0 and variance PIXEL_MAX**2 computes x / sqrt(PIXEL_MAX**2) = x / PIXEL_MAX, the
    very float32 division of data.load_arrays (Rescaling's x * (1 / 255) differs from it in the last bit for
    126 of the 256 pixel values). The added layers compute in float32 whatever the mixed-precision policy,
    as the input pipeline does.
    """
    images = tf.keras.Input(shape=IMAGE_SHAPE[:2], dtype="uint8", name="images")
    scaled = tf.keras.layers.Normalization(mean=0.0, variance=PIXEL_MAX ** 2, dtype="float32", name="scale")(images)
    with_channel = tf.keras.layers.Reshape(IMAGE_SHAPE, dtype="float32", name="channel")(scaled)
    probabilities = tf.keras.layers.Softmax(dtype="float32", name="probabilities")(cnn(with_channel))
    return tf.keras.Model(images, probabilities, name="fashion_mnist_classifier")

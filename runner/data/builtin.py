"""The built-in datasets: Fashion-MNIST (from its IDX files or tf.keras.datasets) and synthetic look-alikes."""

from __future__ import annotations

import os

import numpy as np

from runner.data.idx import IMAGE_SIZE, load_idx_directory
from runner.data.source import DataSplits
from runner.errors import RunnerError

FASHION_MNIST_CLASSES = 10


def keras_cache_dir() -> str:
    """Where tf.keras.datasets.fashion_mnist keeps its files (tf_keras's get_file default)."""
    return os.path.join(os.path.expanduser("~"), ".keras", "datasets", "fashion-mnist")


def fashion_mnist(dir: str | None = None) -> DataSplits:  # noqa: A002  (the config key users know)
    """Fashion-MNIST's 60,000 training and 10,000 test images (28x28 uint8, 10 classes), from the four IDX
    files in `dir`, or through tf.keras.datasets (which downloads them) when `dir` is null."""
    if dir is not None:
        train_x, train_y, test_x, test_y = load_idx_directory(dir)
        source = {"uri": os.path.abspath(dir)}
    else:
        train_x, train_y, test_x, test_y = _load_keras_fashion_mnist()
        source = {"uri": keras_cache_dir()}
    return DataSplits((train_x, train_y), (test_x, test_y), num_classes=FASHION_MNIST_CLASSES, source=source)


def _load_keras_fashion_mnist() -> tuple[np.ndarray, ...]:
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

    try:
        (train_x, train_y), (test_x, test_y) = tf.keras.datasets.fashion_mnist.load_data()
    except Exception as error:  # the download raises anything from URLError to a bad-gzip error
        raise RunnerError(
            f"tf.keras.datasets.fashion_mnist.load_data() could not load Fashion-MNIST ({error}). "
            "Fix: set dataset.dir to a directory holding the four IDX files, or copy them to "
            "~/.keras/datasets/fashion-mnist/."
        ) from None
    return train_x, train_y, test_x, test_y


def synthetic(
    train_examples: int = 2048, test_examples: int = 512, num_classes: int = FASHION_MNIST_CLASSES, seed: int = 0
) -> DataSplits:
    """Noisy copies of one random 28x28 prototype per class: random, yet learnable in a few steps."""
    rng = np.random.default_rng(seed)
    prototypes = rng.uniform(0, 255, size=(num_classes, *IMAGE_SIZE))

    def split(count: int):
        labels = rng.integers(0, num_classes, size=count)
        noise = rng.normal(0, 64, size=(count, *IMAGE_SIZE))
        return np.clip(prototypes[labels] + noise, 0, 255).astype(np.uint8), labels.astype(np.uint8)

    return DataSplits(split(train_examples), split(test_examples), num_classes=num_classes)

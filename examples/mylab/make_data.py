"""Write the example's data into data/: scikit-learn's 1,797 handwritten digits (8x8 images, values 0-16,
10 classes; shipped with scikit-learn, so no download), split once with a fixed seed into 1,440 training
and 357 test images; and scikit-learn's diabetes data (442 patients, 10 measurements each, the disease's progression
a year later to predict), split the same way into 353 training and 89 test patients.

    data/digits.npz                              x_train, y_train, x_test, y_test (uint8)
    data/diabetes.npz                            x_train (n, 10), y_train (n,), x_test, y_test (float32)
    data/tfrecord/train-0000K-of-00004.tfrecord  the same training images in 4 shards of 360
    data/tfrecord/test-00000-of-00001.tfrecord   the test images

A TFRecord example holds `image` (the 64 raw uint8 values as bytes) and `label` (int64). Several training
shards let the workers of a MultiWorkerMirrored cluster each read their own files.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from sklearn.datasets import load_diabetes, load_digits

TRAIN_EXAMPLES = 1440
TRAIN_SHARDS = 4
TRAIN_PATIENTS = 353


def split(count: int, train_count: int) -> tuple[np.ndarray, np.ndarray]:
    """The indices of a fixed random split of `count` examples: `train_count` for training, the rest for testing."""
    order = np.random.default_rng(0).permutation(count)
    return order[:train_count], order[train_count:]


def main(out: Path = Path("data")) -> None:
    digits = load_digits()
    images = digits.images.astype(np.uint8)  # integers 0-16: the runner divides them by dataset.scale=16
    labels = digits.target.astype(np.uint8)
    train, test = split(len(labels), TRAIN_EXAMPLES)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out / "digits.npz", x_train=images[train], y_train=labels[train], x_test=images[test], y_test=labels[test]
    )
    print(f"{out / 'digits.npz'}: {len(train)} training and {len(test)} test images of 8x8, values 0-16")
    write_diabetes(out / "diabetes.npz")

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # only to write TFRecord files

    def write(path: Path, indices: np.ndarray) -> None:
        with tf.io.TFRecordWriter(str(path)) as writer:
            for index in indices:
                feature = {
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[images[index].tobytes()])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(labels[index])])),
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())

    records = out / "tfrecord"
    records.mkdir(exist_ok=True)
    for shard, indices in enumerate(np.array_split(train, TRAIN_SHARDS)):
        write(records / f"train-{shard:05d}-of-{TRAIN_SHARDS:05d}.tfrecord", indices)
    write(records / "test-00000-of-00001.tfrecord", test)
    print(f"{records}/: {TRAIN_SHARDS} training shards of {len(train) // TRAIN_SHARDS} and 1 test shard")


def write_diabetes(path: Path) -> None:
    """The regression example's data (task=regression dataset=my_diabetes): the ten measurements standardized
    (mean 0, variance 1 over all patients), the target in hundreds of points of the progression score (0.25-3.46),
    so that the default optimizer's learning rate suits both."""
    diabetes = load_diabetes(scaled=False)
    measurements = diabetes.data.astype(np.float64)
    measurements = ((measurements - measurements.mean(axis=0)) / measurements.std(axis=0)).astype(np.float32)
    targets = (diabetes.target / 100).astype(np.float32)
    train, test = split(len(targets), TRAIN_PATIENTS)
    np.savez_compressed(
        path,
        x_train=measurements[train],
        y_train=targets[train],
        x_test=measurements[test],
        y_test=targets[test],
    )
    print(f"{path}: {len(train)} training and {len(test)} test patients of 10 measurements, a float target each")


if __name__ == "__main__":
    main()

"""mylab's data, as make_data.py writes it. The runner calls a dataset option's `_target_` with the
option's other keys (and `seed=` when it takes one) and expects runner.data.source.DataSplits, or Keras's
((x_train, y_train), (x_test, y_test)). Inputs stay raw (here integers 0-16): the runner divides them by
`dataset.scale`, and the logged model does the same inside, so it serves what the files hold.
"""

from __future__ import annotations

import glob
import os

import numpy as np

from runner.data.source import DataSplits

NUM_CLASSES = 10


def digits(path: str = "data/digits.npz") -> DataSplits:
    """The digits from make_data.py's .npz, held in memory: uint8 images (n, 8, 8) and their labels."""
    path = os.path.abspath(path)  # relative to the directory the command runs in
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} does not exist: run `python make_data.py` in the example's directory first, or set dataset.path"
        )
    with np.load(path) as files:
        return DataSplits(
            train=(files["x_train"], files["y_train"]),
            test=(files["x_test"], files["y_test"]),
            num_classes=NUM_CLASSES,
            source={"uri": path},
        )


def digits_tfrecord(
    train_files: str = "data/tfrecord/train-*.tfrecord", test_files: str = "data/tfrecord/test-*.tfrecord"
) -> DataSplits:
    """The digits from make_data.py's TFRecord shards, streamed: tf.data datasets of (image, label) pairs.

    Naming the training files (`train_files`) lets MultiWorkerMirrored workers each read their own shards
    instead of every worker reading every example."""
    import tensorflow as tf

    def files(pattern: str) -> list[str]:
        found = sorted(glob.glob(os.path.abspath(pattern)))
        if not found:
            raise FileNotFoundError(f"no file matches {pattern}: run `python make_data.py` first")
        return found

    features = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record):
        example = tf.io.parse_single_example(record, features)
        image = tf.reshape(tf.io.decode_raw(example["image"], tf.uint8), (8, 8))
        return image, example["label"]

    train, test = files(train_files), files(test_files)
    count = lambda paths: sum(1 for _ in tf.data.TFRecordDataset(paths))  # noqa: E731  (1,797 small records)
    return DataSplits(
        train=tf.data.TFRecordDataset(train).map(parse),
        test=tf.data.TFRecordDataset(test).map(parse),
        num_classes=NUM_CLASSES,
        source={"uri": os.path.dirname(train[0])},
        train_files=train,
        train_examples=count(train),
        test_examples=count(test),
    )

"""The workload's examples written as files, for variants that read them from disk: TFRecord files (raw uint8
images, streamed) or one .npz (loaded into memory), holding the training prefix `copies` times over.

A variant asks for them with an item `data:tfrecord`, `data:tfrecord*10` or `data:npz*10`; the files are
written once per benchmark, before the first round, and the same examples the in-memory variants train on
(the first `train_examples` of Fashion-MNIST, or the synthetic set) are what the files hold, repeated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

TRAIN_FILES = 8  # at least as many as workers would need; a few large sequential reads each


@dataclass(frozen=True)
class FileData:
    kind: str  # tfrecord | npz
    copies: int = 1

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.copies}x"

    def overrides(self, workdir: str) -> list[str]:
        where = os.path.join(workdir, "data", self.name)
        if self.kind == "npz":
            return ["dataset=npz", f"dataset.path={where}/data.npz", "dataset.name=fashion_mnist"]
        return [
            "dataset=tfrecord",
            f"dataset.train_files='{where}/train-*.tfrecord'",
            f"dataset.test_files='{where}/test-*.tfrecord'",
            "dataset.image_shape=[28,28]",
            "dataset.name=fashion_mnist",
        ]


def parse_data(item: str) -> FileData:
    """`data:tfrecord` or `data:npz*10`."""
    kind, _, copies = item.split(":", 1)[1].partition("*")
    if kind not in ("tfrecord", "npz"):
        raise ValueError(f"{item!r}: the data a variant reads is data:tfrecord or data:npz (optionally *copies)")
    return FileData(kind, int(copies or 1))


def workload_arrays(data_dir: str | None, train_examples: int) -> tuple[np.ndarray, ...]:
    """The training prefix and the test set the in-memory variants use."""
    if data_dir:
        from runner.data.idx import load_idx_directory

        train_x, train_y, test_x, test_y = load_idx_directory(data_dir)
    else:
        from runner.data.builtin import synthetic

        splits = synthetic(train_examples=train_examples, test_examples=10000)
        (train_x, train_y), (test_x, test_y) = splits.train, splits.test
    return train_x[:train_examples], train_y[:train_examples], test_x, test_y


def write(data: FileData, data_dir: str | None, train_examples: int, workdir: str) -> None:
    where = os.path.join(workdir, "data", data.name)
    if os.path.isdir(where):
        return
    os.makedirs(where)
    train_x, train_y, test_x, test_y = workload_arrays(data_dir, train_examples)
    train_x, train_y = np.tile(train_x, (data.copies, 1, 1)), np.tile(train_y, data.copies)
    if data.kind == "npz":
        np.savez(os.path.join(where, "data.npz"), x_train=train_x, y_train=train_y, x_test=test_x, y_test=test_y)
        return
    for prefix, inputs, labels, files in (("train", train_x, train_y, TRAIN_FILES), ("test", test_x, test_y, 1)):
        for index, part in enumerate(np.array_split(np.arange(len(labels)), files)):
            _write_tfrecord(os.path.join(where, f"{prefix}-{index:02d}.tfrecord"), inputs[part], labels[part])


def _write_tfrecord(path: str, inputs: np.ndarray, labels: np.ndarray) -> None:
    import tensorflow as tf

    with tf.io.TFRecordWriter(path) as writer:
        for image, label in zip(inputs, labels, strict=True):
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())

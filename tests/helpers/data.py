"""Data a test trains on, written or made for it: Fashion-MNIST's IDX layout, .npz files, TFRecord files, image
folders and a callable's tf.data datasets, all of random images (TensorFlow imported where a function needs it)."""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable, Sequence

import numpy as np


def write_idx(path, array: np.ndarray, compress: bool = True) -> None:
    """IDX: two zero bytes, a type code (0x08 = uint8), the rank, big-endian dims, then the data."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if compress:
        with gzip.open(path, "wb") as handle:
            handle.write(payload)
    else:
        path.write_bytes(payload)


def write_fashion_mnist(directory, train: int = 30, test: int = 10, compress: bool = True, seed: int = 0):
    """Fashion-MNIST's four files under their names in `directory`, random images and labels; the arrays."""
    from runner.data.idx import IDX_FILES

    rng = np.random.default_rng(seed)
    arrays = {
        "train_images": rng.integers(0, 256, (train, 28, 28)),
        "train_labels": rng.integers(0, 10, train),
        "test_images": rng.integers(0, 256, (test, 28, 28)),
        "test_labels": rng.integers(0, 10, test),
    }
    for key, stem in IDX_FILES.items():
        write_idx(directory / (stem + (".gz" if compress else "")), arrays[key], compress)
    return arrays


SHAPE = (16, 16)


def images(count: int, shape=SHAPE, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, *shape), dtype=np.uint8)


def write_tfrecords(
    directory,
    prefix: str,
    files: int,
    per_file: int,
    shape=SHAPE,
    encoding: str = "raw",
    classes: int = 3,
    label_offset: int = 0,
    labels: Callable[[np.ndarray], Sequence[float] | Sequence[int]] | None = None,
) -> list[np.ndarray]:
    """Files prefix-0.tfrecord, ...; the first two pixels of every image are (file index, record index), so
    a test can tell which file an example came from. Each record's label is a class index, or `labels(image)`'s
    values (stored as floats where they are floats, else as int64s). Returns each file's images."""
    import tensorflow as tf

    written = []
    for index in range(files):
        pixels = images(per_file, shape, seed=index)
        flat = pixels.reshape(per_file, -1)
        flat[:, 0], flat[:, 1] = index, np.arange(per_file)
        with tf.io.TFRecordWriter(str(directory / f"{prefix}-{index}.tfrecord")) as writer:
            for number, image in enumerate(pixels):
                data = (
                    image.tobytes()
                    if encoding == "raw"
                    else tf.io.encode_png(image if image.ndim == 3 else image[..., None]).numpy()
                )
                feature = {
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                    "label": _label_feature(
                        [(number + index) % classes + label_offset] if labels is None else list(labels(image))
                    ),
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        written.append(pixels)
    return written


def _label_feature(values: list):
    import tensorflow as tf

    if any(isinstance(value, float | np.floating) for value in values):
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def tfrecord_keys(directory, **keys) -> dict[str, str]:
    """dataset=tfrecord's keys for the files write_tfrecords wrote in `directory`, and `keys`."""
    return {
        "train_files": f"'{directory}/train-*.tfrecord'",
        "test_files": f"'{directory}/test-*.tfrecord'",
        "image_shape": f"[{','.join(map(str, SHAPE))}]",
        **keys,
    }


def tfrecord_options(directory, **keys) -> list[str]:
    """The command line's dataset=tfrecord overrides for the files write_tfrecords wrote in `directory`."""
    return ["dataset=tfrecord", *(f"dataset.{key}={value}" for key, value in tfrecord_keys(directory, **keys).items())]


def tfrecord_data(directory, workers: int = 1, task: str = "classification", **keys):
    """The runner's TrainingData of the files write_tfrecords wrote in `directory`."""
    from helpers.config import dataset_settings
    from runner.data.loading import load_data

    settings = dataset_settings("tfrecord", **tfrecord_keys(directory, **keys))
    return load_data(settings, seed=0, workers=workers, task=task)


def write_image_folder(root, per_class: int = 4, classes=("cat", "dog"), size=(16, 12), channels: int = 3) -> None:
    import tensorflow as tf

    for split in ("train", "test"):
        for label, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True)
            for number, image in enumerate(images(per_class, (*size, channels), seed=label)):
                (folder / f"{number}.png").write_bytes(tf.io.encode_png(image).numpy())


def write_npz(path, train: int = 40, test: int = 12, **replace) -> None:
    rng = np.random.default_rng(1)
    arrays = {
        "x_train": images(train),
        "y_train": rng.integers(0, 4, train),
        "x_test": images(test, seed=2),
        "y_test": rng.integers(0, 4, test),
        **replace,
    }
    np.savez(path, **arrays)


def origin(batch) -> list[tuple[int, int]]:
    """(file, record) of each example of a training batch (inputs scaled by 1/255)."""
    raw = np.rint(batch.numpy().reshape(len(batch), -1) * 255).astype(int)
    return [(int(row[0]), int(row[1])) for row in raw]


def stream_of_examples(count: int = 64, seed: int = 0, targets: bool = False):
    """A callable's own tf.data datasets of unknown length (a generator), as a user might write
    (dataset._target_=helpers.data.stream_of_examples): class indices, or with `targets` one float per example
    (the image's mean pixel, for task=regression)."""
    import tensorflow as tf

    from runner.data.source import DataSplits

    def split(size: int, offset: int):
        pixels = images(size, seed=seed + offset)
        labels = pixels.reshape(size, -1).mean(axis=1).astype(np.float32) if targets else np.arange(size) % 3
        label_spec = tf.TensorSpec((), tf.float32 if targets else tf.int64)
        return tf.data.Dataset.from_generator(
            lambda: iter(zip(pixels, labels, strict=True)),
            output_signature=(tf.TensorSpec(SHAPE, tf.uint8), label_spec),
        )

    return DataSplits(split(count, 0), split(count // 2, 1), num_classes=None if targets else 3)


def stream_with_validation(count: int = 48, with_validation: bool = True):
    """A callable's own tf.data datasets, with (or without) its own validation split
    (dataset._target_=helpers.data.stream_with_validation)."""
    import tensorflow as tf

    from runner.data.source import DataSplits

    def split(size: int, offset: int):
        return tf.data.Dataset.from_tensor_slices((images(size, seed=offset), np.arange(size) % 3))

    return DataSplits(
        split(count, 0), split(count // 2, 1), num_classes=3, validation=split(12, 2) if with_validation else None
    )

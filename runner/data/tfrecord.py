"""The `tfrecord` dataset kind: tf.train.Example records in TFRecord files, streamed from disk.

Each record holds an image (raw uint8 bytes, or a PNG or JPEG file) and an integer label. The files are
checked and counted once, streaming (a label-only pass: how many examples each file holds, the labels' range,
the raw images' sizes), so a run knows its steps per epoch and a bad file is one paragraph before training.
"""

from __future__ import annotations

import glob as globbing
import os
from collections.abc import Sequence

import numpy as np

from runner.data.source import DataSplits, FileRecords
from runner.errors import RunnerError

ENCODINGS = ("raw", "png", "jpeg")
READ_BUFFER_BYTES = 4 << 20  # per file: large sequential reads
_SCAN_BATCH = 1024  # records parsed at once per file: bounded memory, whatever the file size


def tfrecord(
    train_files: str | Sequence[str],
    test_files: str | Sequence[str],
    image_key: str = "image",
    label_key: str = "label",
    image_shape: Sequence[int] = (28, 28),
    image_encoding: str = "raw",
    num_classes: int | None = None,
    shuffle_buffer: int = 10_000,
) -> DataSplits:
    """The files the two globs match (sorted); image_shape: (height, width) or (height, width, channels);
    num_classes: null = the largest label + 1."""
    shape = _shape(image_shape)
    if image_encoding not in ENCODINGS:
        raise RunnerError(
            f"dataset.image_encoding={image_encoding!r} is not one of {', '.join(ENCODINGS)}. Fix: use "
            "raw (the image's uint8 bytes, row-major), png or jpeg (an encoded image file)."
        )
    if not isinstance(shuffle_buffer, int) or shuffle_buffer < 1:
        raise RunnerError(
            f"dataset.shuffle_buffer={shuffle_buffer!r} is not a positive number of records. Fix: "
            "pass e.g. dataset.shuffle_buffer=10000."
        )
    train, test = _glob("train_files", train_files), _glob("test_files", test_files)
    import tensorflow as tf  # TensorFlow when called: its signature is checked before TF loads

    train_where, test_where = f"dataset.train_files={train_files!r}", f"dataset.test_files={test_files!r}"
    for where, files in ((train_where, train), (test_where, test)):
        _check_first_record(where, files[0], image_key, label_key, shape, image_encoding)
    train_counts, train_labels = _scan(train_where, train, image_key, label_key, shape, image_encoding)
    test_counts, test_labels = _scan(test_where, test, image_key, label_key, shape, image_encoding)
    classes = num_classes if num_classes is not None else max(train_labels[1], test_labels[1]) + 1
    for where, (low, high, file) in ((train_where, train_labels), (test_where, test_labels)):
        if low < 0 or high >= classes:
            bad = low if low < 0 else high
            raise RunnerError(
                f"{where}: {file} holds label {bad}, outside 0..{classes - 1} for {classes} "
                "classes. Fix: store class indices 0..num_classes-1 under dataset.label_key"
                + (", or set dataset.num_classes to the number of classes" if num_classes is not None else "")
                + "."
            )

    def read(file):
        return tf.data.TFRecordDataset(file, buffer_size=READ_BUFFER_BYTES)

    features = {image_key: tf.io.FixedLenFeature([], tf.string), label_key: tf.io.FixedLenFeature([], tf.int64)}
    if image_encoding == "raw":

        def decode_batch(records):
            parsed = tf.io.parse_example(records, features)
            images = tf.reshape(tf.io.decode_raw(parsed[image_key], tf.uint8), (-1, *shape))
            return images, parsed[label_key]

        record_decoder, batch_decoder = None, decode_batch
    else:
        channels = shape[2] if len(shape) == 3 else 1
        decode = tf.io.decode_png if image_encoding == "png" else tf.io.decode_jpeg

        def decode_record(record):
            parsed = tf.io.parse_single_example(record, features)
            image = decode(parsed[image_key], channels=channels)
            return tf.ensure_shape(tf.reshape(image, shape), shape), parsed[label_key]

        record_decoder, batch_decoder = decode_record, None
    splits = [
        FileRecords(
            files,
            shape,
            "uint8",
            read=read,
            counts=counts,
            shuffle_buffer=shuffle_buffer,
            decode_record=record_decoder,
            decode_batch=batch_decoder,
        )
        for files, counts in ((train, train_counts), (test, test_counts))
    ]
    where = os.path.commonpath([os.path.dirname(file) for file in (*train, *test)])
    return DataSplits(
        splits[0],
        splits[1],
        num_classes=classes,
        source={"uri": where},
        train_files=train,
        train_examples=sum(train_counts),
        test_examples=sum(test_counts),
    )


def _shape(image_shape) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in image_shape)
    except (TypeError, ValueError):
        shape = ()
    if len(shape) not in (2, 3) or min(shape) < 1:
        raise RunnerError(
            f"dataset.image_shape={image_shape!r} is not an image's shape. Fix: pass [height, width] "
            "for grey images or [height, width, channels], e.g. dataset.image_shape=[28,28]."
        )
    return shape


def _glob(key: str, patterns) -> list[str]:
    if patterns is None:
        raise RunnerError(
            f"dataset.{key} is missing: dataset=tfrecord reads the files it matches. Fix: pass "
            f"dataset.{key}='/data/{key.split('_')[0]}-*.tfrecord' (a glob, quoted)."
        )
    items = [patterns] if isinstance(patterns, str) else list(patterns or ())
    files = sorted(
        {file for item in items for file in globbing.glob(os.path.expanduser(str(item))) if os.path.isfile(file)}
    )
    if not files:
        raise RunnerError(
            f"dataset.{key}={patterns!r} matches no file. Fix: give a glob of TFRecord files that "
            f"exist, e.g. dataset.{key}='/data/{key.split('_')[0]}-*.tfrecord' (quoted)."
        )
    return [os.path.abspath(file) for file in files]


def _check_first_record(
    where: str, file: str, image_key: str, label_key: str, shape: tuple[int, ...], encoding: str
) -> None:
    """The first record has both keys, of the right kinds, and an image of the configured shape."""
    import tensorflow as tf  # TensorFlow when called: its signature is checked before TF loads

    try:
        first = next(iter(tf.data.TFRecordDataset(file).take(1)), None)
    except tf.errors.OpError as error:
        raise RunnerError(
            f"{where}: {file} is not a readable TFRecord file ({type(error).__name__}: "
            f"{' '.join(error.message.split())[:200]}). Fix: write it with tf.io.TFRecordWriter, or "
            "leave it out of the glob."
        ) from None
    if first is None:
        return  # an empty file: the scan counts 0 records in it
    try:
        example = tf.train.Example.FromString(first.numpy())
    except Exception:
        raise RunnerError(
            f"{where}: the records of {file} are not tf.train.Example protos. Fix: write each "
            "record as tf.train.Example(...).SerializeToString()."
        ) from None
    feature = example.features.feature
    found = ", ".join(sorted(feature)) or "none"
    for option, name, kind in (("image_key", image_key, "bytes_list"), ("label_key", label_key, "int64_list")):
        if name not in feature:
            raise RunnerError(
                f"dataset.{option}={name!r}: the records of {file} have no feature {name!r} (their "
                f"features: {found}). Fix: set dataset.{option} to the feature holding the "
                f"{option.split('_')[0]}."
            )
        if feature[name].WhichOneof("kind") != kind:
            raise RunnerError(
                f"dataset.{option}={name!r}: in {file} that feature is a "
                f"{feature[name].WhichOneof('kind')}, not a {kind}. Fix: store the "
                f"{'image as bytes' if kind == 'bytes_list' else 'label as an int64'} under it."
            )
    data = feature[image_key].bytes_list.value[0] if feature[image_key].bytes_list.value else b""
    if encoding == "raw":
        size = int(np.prod(shape))
        if len(data) != size:
            raise RunnerError(
                f"dataset.image_shape={list(shape)}: the first image of {file} holds {len(data)} bytes, "
                f"not the {size} of that shape. Fix: give the images' real shape as "
                "dataset.image_shape, or dataset.image_encoding=png/jpeg for encoded images."
            )
        return
    try:
        decoded = tf.io.decode_image(data, expand_animations=False).shape
    except tf.errors.OpError:
        raise RunnerError(
            f"dataset.image_encoding={encoding}: the first image of {file} is not a PNG or JPEG file. "
            "Fix: use dataset.image_encoding=raw for raw uint8 bytes."
        ) from None
    wanted = (*shape[:2], shape[2] if len(shape) == 3 else 1)
    if tuple(decoded[:2]) != wanted[:2]:
        raise RunnerError(
            f"dataset.image_shape={list(shape)}: the first image of {file} is "
            f"{decoded[0]}x{decoded[1]}. Fix: give its height and width as dataset.image_shape."
        )


def _scan(
    where: str, files: list[str], image_key: str, label_key: str, shape: tuple[int, ...], encoding: str
) -> tuple[list[int], tuple[int, int, str]]:
    """Each file's record count and the labels' range (with a file holding the extreme), in one streaming
    pass that parses only the label (and, for raw images, the image's byte count)."""
    import tensorflow as tf  # TensorFlow when called: its signature is checked before TF loads

    raw = encoding == "raw"
    features = {label_key: tf.io.FixedLenFeature([], tf.int64)}
    if raw:
        features[image_key] = tf.io.FixedLenFeature([], tf.string)
    big = np.iinfo(np.int64).max

    def summarise(file):
        def per_batch(records):
            parsed = tf.io.parse_example(records, features)
            labels = parsed[label_key]
            sizes = tf.strings.length(parsed[image_key]) if raw else tf.zeros_like(labels, tf.int32)
            return tf.stack(
                [
                    tf.size(labels, tf.int64),
                    tf.reduce_min(labels),
                    tf.reduce_max(labels),
                    tf.cast(tf.reduce_min(sizes), tf.int64),
                    tf.cast(tf.reduce_max(sizes), tf.int64),
                ]
            )

        def combine(total, part):
            return tf.stack(
                [
                    total[0] + part[0],
                    tf.minimum(total[1], part[1]),
                    tf.maximum(total[2], part[2]),
                    tf.minimum(total[3], part[3]),
                    tf.maximum(total[4], part[4]),
                ]
            )

        batches = tf.data.TFRecordDataset(file, buffer_size=READ_BUFFER_BYTES).batch(_SCAN_BATCH).map(per_batch)
        return batches.reduce(tf.constant([0, big, -big, big, -big], tf.int64), combine)

    summaries = tf.data.Dataset.from_tensor_slices(files).map(summarise, num_parallel_calls=2, deterministic=True)
    try:
        rows = [row.numpy().tolist() for row in summaries]
    except tf.errors.OpError as error:
        raise RunnerError(
            f"{where}: reading the files failed ({type(error).__name__}: "
            f"{' '.join(error.message.split())[:300]}). Fix: every record must be a tf.train.Example "
            f"with an int64 {label_key!r} and a bytes {image_key!r} (dataset.label_key, "
            "dataset.image_key); rewrite or leave out the file that is not."
        ) from None
    counts = [row[0] for row in rows]
    if not sum(counts):
        raise RunnerError(
            f"{where}: the {len(files)} file(s) hold no records. Fix: point "
            f"{where.split('=')[0]} at files with examples."
        )
    if raw:
        size = int(np.prod(shape))
        for file, row in zip(files, rows, strict=True):
            if row[0] and (row[3] != size or row[4] != size):
                raise RunnerError(
                    f"dataset.image_shape={list(shape)}: {file} holds images of {row[3]} to {row[4]} "
                    f"bytes, not the {size} of that shape. Fix: give the images' real shape as "
                    "dataset.image_shape, or rewrite the file."
                )
    filled = [(file, row) for file, row in zip(files, rows, strict=True) if row[0]]
    low_file, low = min(((file, row[1]) for file, row in filled), key=lambda item: item[1])
    high_file, high = max(((file, row[2]) for file, row in filled), key=lambda item: item[1])
    return counts, (int(low), int(high), low_file if low < 0 else high_file)

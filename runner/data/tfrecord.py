"""The `tfrecord` dataset kind: tf.train.Example records in TFRecord files, streamed from disk.

Each record holds an image (raw uint8 bytes, or a PNG or JPEG file) and its label: a class index (int64) for
task=classification; for the other tasks int64s or floats, dataset.label_shape of them (a regression's targets,
a binary's 0/1 label, a multi-label's 0/1 vector). The files are checked and counted once, streaming (a label-only
pass: how many examples each file holds, the labels' range and how many are not finite or not 0/1, the raw images'
sizes), so a run knows its steps per epoch and a bad file or label is one paragraph before training.
"""

from __future__ import annotations

import glob as globbing
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from runner.data.source import DataSplits, FileRecords
from runner.errors import RunnerError
from runner.task_kinds import TaskKind, kind_named

ENCODINGS = ("raw", "png", "jpeg")
READ_BUFFER_BYTES = 4 << 20  # per file: large sequential reads
_SCAN_BATCH = 1024  # records parsed at once per file: bounded memory, whatever the file size
# A file's summary is six float64s (exact for counts and labels below 2**53): its records, its lowest and highest
# label value, its smallest and largest image in bytes (raw images only; 0 otherwise), and how many label values the
# task's kind does not take (TaskKind.outside). _NO_RECORDS is an empty file's: where each file's sum starts.
_NO_RECORDS = (0.0, np.inf, -np.inf, np.inf, -np.inf, 0.0)
RECORDS, LOW, HIGH, SMALLEST, LARGEST, NOT_TAKEN = range(6)


@dataclass(frozen=True)
class Labels:
    """How the records hold their labels: the feature's key, its values per example, int64s or floats."""

    key: str
    shape: tuple[int, ...] = ()  # () one value
    floats: bool = False

    @property
    def values(self) -> int:
        return int(np.prod(self.shape))


def tfrecord(
    train_files: str | Sequence[str],
    test_files: str | Sequence[str],
    image_key: str = "image",
    label_key: str = "label",
    image_shape: Sequence[int] = (28, 28),
    image_encoding: str = "raw",
    num_classes: int | None = None,
    shuffle_buffer: int = 10_000,
    label_shape: Sequence[int] | None = None,
    task: str = "classification",
) -> DataSplits:
    """The files the two globs match (sorted); image_shape: (height, width) or (height, width, channels);
    num_classes: null = the largest label + 1 (task=classification); label_shape: the label's values per example
    for the other tasks (null: one value); task: the run's task.kind, which the runner supplies."""
    shape = _shape(image_shape)
    _check_encoding(image_encoding)
    _check_shuffle_buffer(shuffle_buffer)
    train, test = _glob("train_files", train_files), _glob("test_files", test_files)
    train_where, test_where = f"dataset.train_files={train_files!r}", f"dataset.test_files={test_files!r}"
    kind = kind_named(task)
    labels = Labels(label_key, _label_shape(label_shape, kind))
    for where, files in ((train_where, train), (test_where, test)):
        labels = _check_first_record(where, files[0], image_key, labels, shape, image_encoding, kind)
    train_counts, train_rows = _scan(train_where, train, image_key, labels, shape, image_encoding, kind)
    test_counts, test_rows = _scan(test_where, test, image_key, labels, shape, image_encoding, kind)
    classes = None
    if kind.class_indices:
        ranges = ((train_where, _label_range(train, train_rows)), (test_where, _label_range(test, test_rows)))
        classes = _classes(num_classes, ranges)
    else:
        for where, files, rows in ((train_where, train, train_rows), (test_where, test, test_rows)):
            _check_label_values(where, files, rows, kind)
    record_decoder, batch_decoder = _decoders(image_key, labels, shape, image_encoding)
    splits = [
        FileRecords(
            files,
            shape,
            "uint8",
            read=_read,
            counts=counts,
            shuffle_buffer=shuffle_buffer,
            decode_record=record_decoder,
            decode_batch=batch_decoder,
            label_shape=labels.shape,
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


def _check_encoding(image_encoding: str) -> None:
    if image_encoding not in ENCODINGS:
        raise RunnerError(
            f"dataset.image_encoding={image_encoding!r} is not one of {', '.join(ENCODINGS)}. Fix: use "
            "raw (the image's uint8 bytes, row-major), png or jpeg (an encoded image file)."
        )


def _check_shuffle_buffer(shuffle_buffer: int) -> None:
    if not isinstance(shuffle_buffer, int) or shuffle_buffer < 1:
        raise RunnerError(
            f"dataset.shuffle_buffer={shuffle_buffer!r} is not a positive number of records. Fix: "
            "pass e.g. dataset.shuffle_buffer=10000."
        )


def _classes(num_classes: int | None, splits: tuple[tuple[str, tuple[int, int, str]], ...]) -> int:
    """num_classes (null: the largest label + 1), once every split's labels, (where, (low, high, file)) as _scan
    found them, are class indices below it."""
    classes = num_classes if num_classes is not None else max(high for _, (_, high, _) in splits) + 1
    for where, (low, high, file) in splits:
        if low < 0 or high >= classes:
            bad = low if low < 0 else high
            raise RunnerError(
                f"{where}: {file} holds label {bad}, outside 0..{classes - 1} for {classes} "
                "classes. Fix: store class indices 0..num_classes-1 under dataset.label_key"
                + (", or set dataset.num_classes to the number of classes" if num_classes is not None else "")
                + "."
            )
    return classes


def _label_shape(label_shape: Sequence[int] | None, kind: TaskKind) -> tuple[int, ...]:
    """dataset.label_shape as a shape: () for null; a classification's labels are one class index."""
    if label_shape is None:
        return ()
    if kind.class_indices:
        raise RunnerError(
            f"dataset.label_shape={label_shape!r} is for a regression's or a multi-label's labels, but task="
            f"{kind.name} reads one class index per example. Fix: leave dataset.label_shape null, or pick the "
            "task that matches the labels (task=regression, binary or multilabel)."
        )
    try:
        shape = tuple(int(size) for size in label_shape)
    except (TypeError, ValueError):
        shape = (0,)
    if not shape or min(shape) < 1:
        raise RunnerError(
            f"dataset.label_shape={label_shape!r} is not a label's shape. Fix: give the label's sizes, e.g. "
            "dataset.label_shape=[3] for three tags or targets per example, or null for one value."
        )
    return shape


def _check_label_values(where: str, files: list[str], rows: list[list[float]], kind: TaskKind) -> None:
    """Every label value of every file is one the task's kind takes (TaskKind.outside: a regression's targets are
    finite; a binary's or a multi-label's labels are 0 or 1)."""
    takes = kind.values_taken
    for file, row in zip(files, rows, strict=True):
        if row[NOT_TAKEN]:
            raise RunnerError(
                f"{where}: {file} holds {int(row[NOT_TAKEN])} label value(s) that are not {takes} (its labels run "
                f"from {row[LOW]:g} to {row[HIGH]:g}), but task={kind.name} takes {takes}. Fix: {kind.values_fix}, "
                "or pick the task that matches the labels (task=classification for class indices 0..n-1, "
                "task=regression for other targets)."
            )


def _read(file: Any) -> Any:
    """A file's records (FileRecords.read)."""
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

    return tf.data.TFRecordDataset(file, buffer_size=READ_BUFFER_BYTES)


def _features(image_key: str | None, labels: Labels) -> dict[str, Any]:
    """What parsing a record reads: the image's bytes (without None) and the label."""
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

    label = tf.io.FixedLenFeature(list(labels.shape), tf.float32 if labels.floats else tf.int64)
    return {labels.key: label, **({image_key: tf.io.FixedLenFeature([], tf.string)} if image_key else {})}


def _decoders(
    image_key: str, labels: Labels, shape: tuple[int, ...], encoding: str
) -> tuple[Callable[[Any], Any] | None, Callable[[Any], Any] | None]:
    """FileRecords' (decode_record, decode_batch): raw images are decoded a batch at once, after batching;
    PNG and JPEG files one record at a time, before it."""
    if encoding == "raw":
        return None, _raw_batch_decoder(image_key, labels, shape)
    return _encoded_record_decoder(image_key, labels, shape, encoding), None


def _raw_batch_decoder(image_key: str, labels: Labels, shape: tuple[int, ...]) -> Callable[[Any], Any]:
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

    features = _features(image_key, labels)

    def decode_batch(records):
        parsed = tf.io.parse_example(records, features)
        images = tf.reshape(tf.io.decode_raw(parsed[image_key], tf.uint8), (-1, *shape))
        return images, parsed[labels.key]

    return decode_batch


def _encoded_record_decoder(
    image_key: str, labels: Labels, shape: tuple[int, ...], encoding: str
) -> Callable[[Any], Any]:
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

    features = _features(image_key, labels)
    channels = shape[2] if len(shape) == 3 else 1
    decode = tf.io.decode_png if encoding == "png" else tf.io.decode_jpeg

    def decode_record(record):
        parsed = tf.io.parse_single_example(record, features)
        image = decode(parsed[image_key], channels=channels)
        return tf.ensure_shape(tf.reshape(image, shape), shape), parsed[labels.key]

    return decode_record


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
    where: str, file: str, image_key: str, labels: Labels, shape: tuple[int, ...], encoding: str, kind: TaskKind
) -> Labels:
    """The first record has both keys, of the right kinds, an image of the configured shape and the label's values;
    the labels as the records hold them (floats where its label is a float_list)."""
    example = _first_example(where, file)
    if example is None:
        return labels  # an empty file: the scan counts 0 records in it
    feature = example.features.feature
    labels = _check_feature_kinds(file, feature, image_key, labels, kind)
    data = feature[image_key].bytes_list.value[0] if feature[image_key].bytes_list.value else b""
    if encoding == "raw":
        _check_raw_size(file, data, shape)
    else:
        _check_encoded_size(file, data, shape, encoding)
    return labels


def _first_example(where: str, file: str) -> Any:
    """The file's first record as a tf.train.Example (None for an empty file)."""
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

    try:
        first = next(iter(tf.data.TFRecordDataset(file).take(1)), None)
    except tf.errors.OpError as error:
        raise RunnerError(
            f"{where}: {file} is not a readable TFRecord file ({type(error).__name__}: "
            f"{' '.join(error.message.split())[:200]}). Fix: write it with tf.io.TFRecordWriter, or "
            "leave it out of the glob."
        ) from None
    if first is None:
        return None
    try:
        return tf.train.Example.FromString(first.numpy())
    except Exception:
        raise RunnerError(
            f"{where}: the records of {file} are not tf.train.Example protos. Fix: write each "
            "record as tf.train.Example(...).SerializeToString()."
        ) from None


def _check_feature_kinds(file: str, feature: Any, image_key: str, labels: Labels, kind: TaskKind) -> Labels:
    """The record has the image as bytes and the label under the configured keys: int64s for a classification,
    int64s or floats for the other tasks, dataset.label_shape's count of them."""
    found = ", ".join(sorted(feature)) or "none"
    label_kinds = ("int64_list",) if kind.class_indices else ("int64_list", "float_list")
    if labels.key in feature and feature[labels.key].WhichOneof("kind") in label_kinds:
        label_kinds = (feature[labels.key].WhichOneof("kind"),)  # the first file's, which every file must share
    for option, name, kinds in (("image_key", image_key, ("bytes_list",)), ("label_key", labels.key, label_kinds)):
        wanted = kinds[0]
        if name not in feature:
            raise RunnerError(
                f"dataset.{option}={name!r}: the records of {file} have no feature {name!r} (their "
                f"features: {found}). Fix: set dataset.{option} to the feature holding the "
                f"{option.split('_')[0]}."
            )
        if feature[name].WhichOneof("kind") not in kinds:
            label = "label as an int64" if len(kinds) == 1 else "label as int64s or floats"
            raise RunnerError(
                f"dataset.{option}={name!r}: in {file} that feature is a "
                f"{feature[name].WhichOneof('kind')}, not a {' or '.join(kinds)}. Fix: store the "
                f"{'image as bytes' if wanted == 'bytes_list' else label} under it"
                + (", or use task=regression for float targets." if option == "label_key" and len(kinds) == 1 else ".")
            )
    values = len(getattr(feature[labels.key], label_kinds[0]).value)
    if values != labels.values:
        shape = list(labels.shape) if labels.shape else "null"
        raise RunnerError(
            f"dataset.label_shape={shape}: the first record of {file} holds {values} label "
            f"value(s) under {labels.key!r}, not the {labels.values} of that shape. Fix: give the labels' real shape "
            "as dataset.label_shape (null for one value, [3] for three), or rewrite the file."
        )
    return Labels(labels.key, labels.shape, floats=label_kinds[0] == "float_list")


def _check_raw_size(file: str, data: bytes, shape: tuple[int, ...]) -> None:
    size = int(np.prod(shape))
    if len(data) != size:
        raise RunnerError(
            f"dataset.image_shape={list(shape)}: the first image of {file} holds {len(data)} bytes, "
            f"not the {size} of that shape. Fix: give the images' real shape as "
            "dataset.image_shape, or dataset.image_encoding=png/jpeg for encoded images."
        )


def _check_encoded_size(file: str, data: bytes, shape: tuple[int, ...], encoding: str) -> None:
    """The first PNG or JPEG image decodes, to the configured height and width."""
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

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
    where: str, files: list[str], image_key: str, labels: Labels, shape: tuple[int, ...], encoding: str, kind: TaskKind
) -> tuple[list[int], list[list[float]]]:
    """Each file's record count and summary, in one streaming pass that parses only the label (and, for raw
    images, the image's byte count)."""
    raw = encoding == "raw"
    rows = _summaries(where, files, image_key, labels, raw, kind)
    counts = [int(row[RECORDS]) for row in rows]
    if not sum(counts):
        raise RunnerError(
            f"{where}: the {len(files)} file(s) hold no records. Fix: point "
            f"{where.split('=')[0]} at files with examples."
        )
    if raw:
        _check_raw_sizes(files, rows, shape)
    return counts, rows


def _summaries(
    where: str, files: list[str], image_key: str, labels: Labels, raw: bool, kind: TaskKind
) -> list[list[float]]:
    """Each file's summary, two files read at once."""
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

    summarise = _file_summariser(image_key, labels, raw, kind)
    summaries = tf.data.Dataset.from_tensor_slices(files).map(summarise, num_parallel_calls=2, deterministic=True)
    try:
        return [row.numpy().tolist() for row in summaries]
    except tf.errors.OpError as error:
        raise RunnerError(
            f"{where}: reading the files failed ({type(error).__name__}: "
            f"{' '.join(error.message.split())[:300]}). Fix: every record must be a tf.train.Example "
            f"with {labels.values} {'float' if labels.floats else 'int64'}(s) under {labels.key!r} and a bytes "
            f"{image_key!r} (dataset.label_key, dataset.label_shape, dataset.image_key); rewrite or leave out the "
            "file that is not."
        ) from None


def _file_summariser(image_key: str, labels: Labels, raw: bool, kind: TaskKind) -> Callable[[Any], Any]:
    """A file name -> its summary, summed up batch by batch."""
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

    summarise_batch = _batch_summariser(image_key, labels, raw, kind)

    def summarise(file):
        batches = tf.data.TFRecordDataset(file, buffer_size=READ_BUFFER_BYTES).batch(_SCAN_BATCH)
        return batches.map(summarise_batch).reduce(tf.constant(_NO_RECORDS, tf.float64), _summed)

    return summarise


def _batch_summariser(image_key: str, labels: Labels, raw: bool, kind: TaskKind) -> Callable[[Any], Any]:
    """A batch of records -> its summary, parsing only the label (and a raw image's bytes, for their count)."""
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

    features = _features(image_key if raw else None, labels)

    def summarise_batch(records):
        parsed = tf.io.parse_example(records, features)
        values = tf.cast(parsed[labels.key], tf.float64)
        sizes = tf.strings.length(parsed[image_key]) if raw else tf.zeros_like(records, tf.int32)
        return tf.stack(
            [
                tf.cast(tf.size(records), tf.float64),
                tf.reduce_min(values),
                tf.reduce_max(values),
                tf.cast(tf.reduce_min(sizes), tf.float64),
                tf.cast(tf.reduce_max(sizes), tf.float64),
                tf.reduce_sum(tf.cast(kind.outside(values), tf.float64)),
            ]
        )

    return summarise_batch


def _summed(total: Any, part: Any) -> Any:
    """Two summaries as one."""
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

    return tf.stack(
        [
            total[RECORDS] + part[RECORDS],
            tf.minimum(total[LOW], part[LOW]),
            tf.maximum(total[HIGH], part[HIGH]),
            tf.minimum(total[SMALLEST], part[SMALLEST]),
            tf.maximum(total[LARGEST], part[LARGEST]),
            total[NOT_TAKEN] + part[NOT_TAKEN],
        ]
    )


def _check_raw_sizes(files: list[str], rows: list[list[float]], shape: tuple[int, ...]) -> None:
    """Every raw image of every file holds the bytes of the configured shape."""
    size = int(np.prod(shape))
    for file, row in zip(files, rows, strict=True):
        if not row[RECORDS]:
            continue  # an empty file
        smallest, largest = int(row[SMALLEST]), int(row[LARGEST])
        if smallest != size or largest != size:
            raise RunnerError(
                f"dataset.image_shape={list(shape)}: {file} holds images of {smallest} to {largest} "
                f"bytes, not the {size} of that shape. Fix: give the images' real shape as "
                "dataset.image_shape, or rewrite the file."
            )


def _label_range(files: list[str], rows: list[list[float]]) -> tuple[int, int, str]:
    """The lowest and the highest label of the files, and the file holding the lowest where it is negative,
    else the one holding the highest (the one a label outside the classes is reported in)."""
    filled = [(file, row) for file, row in zip(files, rows, strict=True) if row[RECORDS]]
    low_file, low = min(((file, row[LOW]) for file, row in filled), key=lambda item: item[1])
    high_file, high = max(((file, row[HIGH]) for file, row in filled), key=lambda item: item[1])
    return int(low), int(high), low_file if low < 0 else high_file

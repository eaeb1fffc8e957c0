"""Training data streamed from disk (TFRecord files, image folders) or from a callable's tf.data datasets.

Per epoch the files come in an order drawn from (seed, epoch) alone; they are read interleaved, shuffled
through a bounded buffer, batched and decoded in parallel, and prefetched, so memory holds buffers, never
the data set. Under MultiWorkerMirrored each worker reads its own files when there are at least as many
files as workers (tf.data's auto-shard by FILE, which finds the reader behind the file list), and otherwise
reads every file and keeps its share of the examples (auto-shard by DATA).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from runner.data.describe import describe_stream, file_digest, source_of
from runner.data.in_memory import with_options
from runner.data.source import DataSpec, DataSplits, FileRecords, describe_spec
from runner.data.validation import (
    cannot_fold,
    cannot_split,
    check_one_way,
    fold_split,
    split_files,
    validation_optional,
)
from runner.errors import RunnerError
from runner.task_kinds import KINDS, TaskKind

# Files read at once by one input pipeline: a fixed number (not AUTOTUNE, which follows the machine's cores),
# so the order of the records, and with it every batch, is the same on any machine.
CYCLE_LENGTH = 4
DEFAULT_SHUFFLE_BUFFER = 10_000
DECODE_EXAMPLES = 1024  # records decoded per call of a batch decoder


@dataclass(frozen=True)
class Split:
    """One split as the pipeline reads it: files (with per-file limits, after the prefix) or a dataset."""

    records: FileRecords | None
    dataset: Any  # tf.data.Dataset of (input, label) pairs, when there are no files
    files: tuple[str, ...] = ()
    # With a reader: the examples to read from each file (-1: all); without: each file's label.
    per_file: tuple[int, ...] = ()
    examples: int | None = None

    @property
    def by_file(self) -> bool:
        """Many records per file, behind a reader that tf.data's auto-shard can find."""
        return self.records is not None and self.records.read is not None

    @property
    def shuffle_buffer(self) -> int:
        return self.records.shuffle_buffer if self.records is not None else DEFAULT_SHUFFLE_BUFFER

    def source(self, seed=None, epoch=None) -> tf.data.Dataset:
        """The epoch's files (in an order drawn from (seed, epoch); in their order without a seed), or the
        dataset itself."""
        if self.records is None:
            return self.dataset
        files, per_file = tf.constant(self.files), tf.constant(self.per_file, tf.int64)
        if seed is not None:
            order = tf.random.experimental.stateless_shuffle(
                tf.range(len(self.files)), seed=tf.stack([tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64)])
            )
            files, per_file = tf.gather(files, order), tf.gather(per_file, order)
        return tf.data.Dataset.from_tensor_slices((files, per_file))

    def read(self, source: tf.data.Dataset) -> tf.data.Dataset:
        """Records from the files, `CYCLE_LENGTH` files at a time, in a fixed order."""
        read = self.records.read if self.records is not None else None
        if read is None:  # not by_file
            return source  # (path, label) pairs, or the dataset's examples
        return source.interleave(
            lambda file, limit: read(file).take(limit),
            cycle_length=min(CYCLE_LENGTH, len(self.files)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )


class StreamingData:
    """The TrainingData of runner.data.source, read from files or a dataset as the loop asks for batches."""

    def __init__(
        self,
        spec: DataSpec,
        train: Split,
        test: Split,
        descriptions: list[dict[str, Any]],
        workers: int = 1,
        validation: Split | None = None,
        kind: TaskKind = KINDS["classification"],
    ):
        self.spec = spec
        self.kind = kind
        self.train = train
        self.test = test
        self.validation = validation
        self.descriptions = descriptions
        self.train_examples = train.examples
        self.shard_policy = _policy(train, workers)
        self._test_policy = _policy(test, workers)
        self.train_files = train.files

    def inputs(self) -> list[dict[str, Any]]:
        return self.descriptions

    # The shuffle buffer's seed is fixed when a dataset is built: loop=for_in builds one per epoch.
    epoch_read_when_iterated = False

    def train_dataset(
        self,
        batch_size: int,
        seed,
        first_epoch: int = 1,
        epochs: int | None = 1,
        skip_batches: int = 0,
        input_context: tf.distribute.InputContext | None = None,
    ) -> tf.data.Dataset:
        """Batches of `batch_size` for epochs first_epoch, first_epoch+1, ... (`epochs` of them; None = endless),
        less the first `skip_batches`.

        Epoch e alone (epochs=1) depends only on (seed, e): its files' order and the shuffle buffer's seed
        come from both; the last batch of an epoch may be partial. Several epochs in one dataset (the
        endless stream of the iterator loops) flow through one shuffle buffer, seeded by (seed, first_epoch),
        so batches may span two epochs, and a run resumed by `skip_batches` sees exactly the batches an
        uninterrupted one would have. With an `input_context` (ParameterServer), each input pipeline
        reads its own files when there are enough of them, else its share of the examples.
        """
        split = self.train
        last = first_epoch + epochs if epochs is not None else 2**62
        source = tf.data.Dataset.range(first_epoch, last).flat_map(lambda epoch: split.source(seed, epoch))
        pipelines = input_context.num_input_pipelines if input_context is not None else 1
        pipeline = input_context.input_pipeline_id if input_context is not None else 0
        by_file = split.by_file and len(split.files) >= pipelines
        if pipelines > 1 and by_file:
            source = source.shard(pipelines, pipeline)
        records = split.read(source)
        if pipelines > 1 and not by_file:
            records = records.shard(pipelines, pipeline)
        # The same order every time this dataset is iterated (each worker iterates its own copy).
        records = records.shuffle(split.shuffle_buffer, seed=_mix(seed, first_epoch), reshuffle_each_iteration=False)
        if skip_batches:
            records = records.skip(skip_batches * batch_size)
        return with_options(self._batches(split, records, batch_size), self.shard_policy)

    def test_dataset(self, batch_size: int) -> tf.data.Dataset:
        return with_options(self._batches(self.test, self.test.read(self.test.source()), batch_size), self._test_policy)

    def validation_split(self) -> dict[str, list] | None:
        if self.validation is None or self.validation.records is None:
            return None  # none, or the callable's own dataset
        return {"files": list(self.validation.files)}

    @property
    def has_validation(self) -> bool:
        return self.validation is not None

    def validation_dataset(self, batch_size: int) -> tf.data.Dataset | None:
        split = self.validation
        if split is None:
            return None
        return with_options(self._batches(split, split.read(split.source()), batch_size), self._test_policy)

    def raw_examples(self, count: int) -> np.ndarray:
        """The first `count` test inputs as the files hold them (the served model's input)."""
        records = self.test.read(self.test.source())
        for inputs, _ in self._batches(self.test, records, count, raw=True).take(1):
            return inputs.numpy()
        raise RunnerError(
            f"dataset.name={self.spec.name!r}: the test split holds no examples. Fix: give a test "
            "split with at least one example."
        )

    def _batches(self, split: Split, records: tf.data.Dataset, batch_size: int, raw: bool = False) -> tf.data.Dataset:
        decode_record = split.records.decode_record if split.records is not None else None
        decode_batch = split.records.decode_batch if split.records is not None else None
        if decode_record is not None:
            records = records.map(decode_record, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        spec, classes = self.spec, self.kind.class_indices

        def finish(*batch):  # a batch of records, or of (inputs, labels)
            inputs, labels = decode_batch(*batch) if decode_batch is not None else batch
            inputs = tf.reshape(inputs, (-1, *spec.raw_shape))
            if not raw:
                # The float32 division of runner.data.in_memory.to_model_input and of the exported model.
                inputs = tf.reshape(
                    tf.cast(inputs, tf.float32) / tf.constant(spec.scale, tf.float32), (-1, *spec.input_shape)
                )
            if classes:
                return inputs, tf.cast(labels, tf.int64)
            # Targets as the in-memory path feeds them (runner.task_kinds.TaskKind.prepare): float32, shaped like
            # the model's output for one example.
            return inputs, tf.reshape(tf.cast(labels, tf.float32), (-1, *spec.output_shape))

        if decode_batch is None:
            batches = records.batch(batch_size).map(finish, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            return batches.prefetch(tf.data.AUTOTUNE)
        # Decoding costs a fixed overhead per call (parse_example: ~4 us per example in batches of 64, 0.6 in
        # batches of 1024): decode a whole number of batches at once, then cut them into batches of
        # `batch_size`, exactly the batches batch(batch_size) would make.
        decoded = records.batch(batch_size * max(1, DECODE_EXAMPLES // batch_size))
        decoded = decoded.map(finish, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return decoded.rebatch(batch_size).prefetch(tf.data.AUTOTUNE)


def _mix(seed, epoch: int):
    """One int64 shuffle seed from (seed, epoch): distinct epochs, distinct seeds."""
    return tf.cast(seed, tf.int64) * 1_000_003 + epoch


def _policy(split: Split, workers: int) -> str:
    return "FILE" if split.by_file and len(split.files) >= workers else "DATA"


def sharding_line(name: str, training_data: Any, workers: int) -> str:
    """The log line that says how MultiWorkerMirrored workers split the training set."""
    files = len(getattr(training_data, "train_files", ()))
    if training_data.shard_policy == "FILE":
        return (
            f"dataset {name}: {files} files for {workers} workers, each worker reads its own files (auto-shard by FILE)"
        )
    held = f"{files} file{'s' if files != 1 else ''}" if files else "one stream of examples"
    return (
        f"dataset {name}: {held} for {workers} workers, each worker reads all of it and keeps its share of the "
        "examples (auto-shard by DATA)"
    )


def streamed(
    settings, splits: DataSplits, seed: int, workers: int = 1, kind: TaskKind = KINDS["classification"]
) -> StreamingData:
    """DataSplits whose splits are FileRecords or tf.data datasets, with the configured prefixes, their labels
    read as `kind` takes them."""
    target = settings.component.target
    train = _split("training", splits.train, settings.train_examples, target, "train_examples")
    test = _split("test", splits.test, settings.test_examples, target, "test_examples")
    if splits.train_examples is not None and train.records is None and train.examples is None:
        train = Split(None, train.dataset, examples=_prefixed(splits.train_examples, settings.train_examples))
    if splits.test_examples is not None and test.records is None and test.examples is None:
        test = Split(None, test.dataset, examples=_prefixed(splits.test_examples, settings.test_examples))
    train, validation = _validation_split(settings, splits, train, seed)
    classes = kind.class_indices
    (train_shape, train_dtype), (test_shape, _) = _example(train, target, classes), _example(test, target, classes)
    shapes = [test_shape, *([_example(validation, target, classes)[0]] if validation is not None else [])]
    if any(shape != train_shape for shape in shapes):
        raise RunnerError(
            f"dataset._target_={target!r}: training inputs are shaped {train_shape} and test (or validation) "
            f"inputs {', '.join(map(str, shapes))}. Fix: give every split examples of one shape."
        )
    splits_read = (train, test, *((validation,) if validation is not None else ()))
    if not classes:
        outputs = _stream_outputs(kind, splits_read, target)
        spec = describe_spec(settings.name, train_shape, train_dtype, outputs[-1], settings.scale, outputs)
    else:
        classes_count = _num_classes(splits, splits_read, target)
        spec = describe_spec(settings.name, train_shape, train_dtype, classes_count, settings.scale)
    source_type, source = source_of(splits.source, target, seed)
    descriptions = [
        describe_stream(
            f"{settings.name}-{name}",
            context,
            _digest(split, splits.digests.get(name), target, seed),
            source_type,
            source,
            split.examples,
            spec.raw_shape,
            spec.raw_dtype,
        )
        for name, context, split in (
            ("train", "training", train),
            ("test", "evaluation", test),
            *((("validation", "validation", validation),) if validation is not None else ()),
        )
    ]
    return StreamingData(spec, train, test, descriptions, workers, validation, kind)


def _num_classes(splits: DataSplits, read: tuple[Split, ...], target: str) -> int:
    """A classification's classes: the callable's num_classes, or an image folder's largest label + 1."""
    if splits.num_classes is not None:
        return int(splits.num_classes)
    labels = [label for split in read if split.records is not None and not split.by_file for label in split.per_file]
    if not labels:
        raise RunnerError(
            f"dataset._target_={target!r} returned streamed data without num_classes, which the "
            "runner cannot read off a stream. Fix: return DataSplits(..., num_classes=N)."
        )
    return max(labels) + 1


def _stream_outputs(kind: TaskKind, read: tuple[Split, ...], target: str) -> tuple[int, ...]:
    """The model's output for one example of a regression, binary or multi-label stream: its labels' shape, the
    same in every split, as `kind` takes it."""
    where = f"task={kind.name} with dataset._target_={target!r}"
    if any(split.records is not None and not split.by_file for split in read):
        raise RunnerError(
            f"{where}: the files' labels are the class index of each file's folder (an image folder), which only "
            "task=classification reads. Fix: use task=classification, or give the labels as NumPy arrays "
            "(dataset=npz) or as a feature of TFRecord files (dataset=tfrecord with dataset.label_shape)."
        )
    shapes = {_labels_of(split, target) for split in read}
    if len(shapes) > 1:
        raise RunnerError(
            f"{where}: the splits' labels differ ({', '.join(str(list(shape)) for shape, _ in sorted(shapes))} per "
            "example). Fix: give every split labels of one shape."
        )
    [(shape, numeric)] = shapes
    return kind.stream_outputs(where, shape, numeric)


def _labels_of(split: Split, target: str) -> tuple[tuple[int, ...], bool]:
    """(one example's label shape, whether its dtype is numeric) of a split."""
    if split.records is not None:
        return tuple(int(size) for size in split.records.label_shape), True
    labels = split.dataset.element_spec[1]
    if not labels.shape.is_fully_defined():
        raise RunnerError(
            f"dataset._target_={target!r} returned a dataset of labels shaped {labels.shape}. Fix: give each "
            "example's label one known shape (dataset.map(lambda x, y: (x, tf.ensure_shape(y, SHAPE))))."
        )
    return tuple(labels.shape.as_list()), labels.dtype.is_integer or labels.dtype.is_floating or labels.dtype.is_bool


def _validation_split(settings, splits: DataSplits, train: Split, seed: int) -> tuple[Split, Split | None]:
    """(the training split, the validation split): the callable's own, or dataset.validation_fraction of the
    training files, whole files each (a tf.data stream cannot be split)."""
    target, fraction = settings.component.target, settings.validation_fraction
    check_one_way(fraction, settings.folds)
    split_seed = settings.split_seed if settings.split_seed is not None else seed
    if settings.folds is not None:  # cross-validation: fold k of the training files is the validation split
        if train.records is None:
            raise cannot_fold(target, settings.folds)
        by_label = np.asarray(train.per_file if not train.by_file else np.zeros(len(train.files), np.int64))
        kept, held = fold_split(by_label, settings.folds, settings.fold, split_seed, target, what="files")
        return _subset(train, kept), _subset(train, held)
    if splits.validation is not None:
        return train, _split("validation", splits.validation, None, target, "validation_fraction")
    if fraction is None:
        return train, None
    if train.records is None:
        if validation_optional():  # a sweep's default: it chooses on the test set instead, and says so
            return train, None
        raise cannot_split(target, fraction)
    labels = None if train.by_file else train.per_file
    kept, held = split_files(train.files, labels, fraction, split_seed, target)
    return _subset(train, kept), _subset(train, held)


def _subset(split: Split, indices) -> Split:
    """The split's files at `indices` (in their order), with their limits or labels and their example count."""
    files = tuple(split.files[int(index)] for index in indices)
    per_file = tuple(split.per_file[int(index)] for index in indices)
    records = split.records
    assert records is not None
    if not split.by_file:
        examples: int | None = len(files)
    elif records.counts is None:
        examples = None
    else:
        examples = sum(
            int(records.counts[int(index)]) if limit == -1 else limit
            for index, limit in zip(indices, per_file, strict=True)
        )
    return Split(records, None, files, per_file, examples)


def _split(name: str, data: Any, prefix: int | None, target: str, key: str) -> Split:
    if isinstance(data, FileRecords):
        return _file_split(name, data, prefix, target, key)
    if isinstance(data, tf.data.Dataset):
        if prefix is not None:
            data = data.take(prefix)
        count = int(data.cardinality())
        return Split(None, data, examples=count if count >= 0 else None)
    raise RunnerError(
        f"dataset._target_={target!r} returned a {type(data).__name__} as the {name} split. Fix: "
        "return (inputs, labels) NumPy arrays, a tf.data.Dataset of (input, label) pairs, or "
        "runner.data.source.FileRecords."
    )


def _file_split(name: str, records: FileRecords, prefix: int | None, target: str, key: str) -> Split:
    files = tuple(str(file) for file in records.files)
    if not files:
        raise RunnerError(
            f"dataset._target_={target!r} returned no files for the {name} split. Fix: point the "
            "dataset at files that exist."
        )
    if records.read is None:  # one record per file: the prefix is the first files
        labels = tuple(int(label) for label in (records.labels or ()))
        if len(labels) != len(files):
            raise RunnerError(
                f"dataset._target_={target!r}: the {name} split has {len(files)} files and "
                f"{len(labels)} labels. Fix: give FileRecords one label per file, or a reader."
            )
        keep = len(files) if prefix is None else min(prefix, len(files))
        return Split(records, None, files[:keep], labels[:keep], keep)
    counts = tuple(int(count) for count in records.counts) if records.counts is not None else None
    if prefix is None:
        return Split(records, None, files, (-1,) * len(files), sum(counts) if counts is not None else None)
    if counts is None:
        raise RunnerError(
            f"dataset.{key}={prefix}: the {name} files' example counts are unknown, so no prefix can "
            f"be taken. Fix: leave dataset.{key} null, or give FileRecords(counts=...)."
        )
    kept, limits, total = [], [], 0
    for file, count in zip(files, counts, strict=True):
        if total >= prefix:
            break
        take = min(count, prefix - total)
        kept.append(file)
        limits.append(take if take < count else -1)
        total += take
    return Split(records, None, tuple(kept), tuple(limits), total)


def _prefixed(count: int, prefix: int | None) -> int:
    return count if prefix is None else min(count, prefix)


def _example(split: Split, target: str, classes: bool = True) -> tuple[tuple[int, ...], str]:
    """One example's input shape and dtype; a dataset's labels one class index each where `classes`."""
    if split.records is not None:
        return tuple(int(d) for d in split.records.example_shape), np.dtype(split.records.dtype).name
    element = split.dataset.element_spec
    if not (isinstance(element, (tuple, list)) and len(element) == 2):
        raise RunnerError(
            f"dataset._target_={target!r} returned a dataset of {element}, not of (input, label) "
            "pairs. Fix: map it to (input, label) pairs of single examples (unbatched)."
        )
    inputs, labels = element
    one_class = labels.shape.rank == 0 and labels.dtype.is_integer
    if not inputs.shape.is_fully_defined() or (classes and not one_class):
        raise RunnerError(
            f"dataset._target_={target!r} returned a dataset of inputs {inputs.shape} {inputs.dtype.name} "
            f"and labels {labels.shape} {labels.dtype.name}. Fix: give unbatched examples of one known "
            f"shape, each with {'one integer label' if classes else 'its label'} (dataset.map(lambda x, y: "
            "(tf.ensure_shape(x, SHAPE), y)))."
        )
    return tuple(inputs.shape.as_list()), inputs.dtype.name


def _digest(split: Split, given: str | None, target: str, seed: int) -> str:
    if given:
        return given
    if split.records is not None:
        return file_digest(split.files, split.per_file)
    # A stream from code: what made it (the callable, its seed, what it yields, the prefix).
    made = f"{target}|{seed}|{split.dataset.element_spec}|{split.examples}"
    return hashlib.sha256(made.encode()).hexdigest()[:16]


__all__: Sequence[str] = ("StreamingData", "streamed", "sharding_line", "Split")

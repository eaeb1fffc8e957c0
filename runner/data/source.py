"""The contract between a dataset callable and the runner.

A dataset option's `_target_` is called with its own arguments from the config (and `seed=`, when it takes
one) and returns DataSplits: the training and test data, as (inputs, labels) NumPy arrays or as tf.data
datasets of unbatched (input, label) pairs, or as FileRecords (files the runner streams itself: it orders
them per epoch, shards them across workers and decodes batches in parallel), and what the runner cannot read
off them. A callable may also return Keras's own shape, `((x_train, y_train), (x_test, y_test))`.

Inputs are raw values (e.g. uint8 pixels): the runner divides them by `dataset.scale` for training, and the
logged model does the same inside, so it serves the raw values the files hold. Examples of rank 2 (grey
images, (height, width)) get a channel axis for the model; the served model takes them without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class DataSplits:
    """What a dataset callable returns."""

    train: Any  # (inputs, labels) arrays, a tf.data.Dataset of unbatched (input, label) pairs, or FileRecords
    test: Any
    num_classes: int | None = None
    # A validation split of its own, held out of `train` and shaped like it: the runner evaluates it every epoch
    # (val_loss, val_accuracy) instead of holding out dataset.validation_fraction itself. A callable returning
    # tf.data datasets must give it for a validation split (the runner cannot split a stream).
    validation: Any = None  # None: the largest label + 1 (arrays only)
    # Where the data came from, as MLflow records a dataset input's source: {"uri": "/path"} for files;
    # None: the callable that made it (code).
    source: Mapping[str, Any] | None = None
    # The files a streamed training set reads, in order: with at least as many files as workers,
    # MultiWorkerMirrored workers read distinct files (auto-shard by FILE) instead of sharding by example.
    train_files: Sequence[str] = ()
    # How many examples each split holds, when a streamed split knows it (steps per epoch follow from it).
    train_examples: int | None = None
    test_examples: int | None = None
    # A digest of what the files hold, for MLflow's dataset inputs (streamed data; arrays are hashed here).
    digests: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FileRecords:
    """A split stored in files and streamed from disk (runner.data.streaming reads it).

    With `read`, each file holds many records (TFRecord): the runner reads the files interleaved, and under
    MultiWorkerMirrored each worker reads its own files (tf.data's auto-shard by FILE finds `read`'s reader).
    Without it, each file is one record, paired with its label (an image folder)."""

    files: Sequence[str]  # in order
    example_shape: tuple[int, ...]  # one raw input, e.g. (28, 28) or (32, 32, 3)
    dtype: str  # the raw inputs' dtype, e.g. "uint8"
    read: Callable[[Any], Any] | None = None  # a file name (string tensor) -> tf.data.Dataset of its records
    labels: Sequence[int] | None = None  # without `read`: each file's label
    counts: Sequence[int] | None = None  # examples per file, when known (prefixes, steps per epoch)
    # One record -> (raw input, label), per record before batching (codecs); or a batch of records ->
    # (raw inputs, labels), after batching (cheap vectorised decoding such as tf.io.decode_raw).
    decode_record: Callable[..., Any] | None = None
    decode_batch: Callable[[Any], Any] | None = None
    shuffle_buffer: int = 10_000  # records held for the per-example shuffle
    # One example's label as the decoders give it: () one value (a class index, a target, a 0/1 label); (n,) n
    # values (multi-label tags, several regression targets).
    label_shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class DataSpec:
    """What the model, the loss and the exported model need to know about the data."""

    name: str
    input_shape: tuple[int, ...]  # one example as the model sees it
    num_classes: int
    raw_shape: tuple[int, ...]  # one example as the data holds it: the served model's input
    raw_dtype: str  # e.g. "uint8"
    scale: float  # training inputs are the raw values divided by this
    # What the model outputs for one example: (num_classes,) logits for a classification; the labels' shape for the
    # other tasks (runner.task_kinds). num_classes, which the model callable receives, is its last size.
    output_shape: tuple[int, ...] = ()

    @property
    def outputs(self) -> tuple[int, ...]:
        return self.output_shape or (self.num_classes,)


class TrainingData(Protocol):
    """What the training loop needs of a dataset, wherever its examples live."""

    @property
    def spec(self) -> DataSpec: ...

    @property
    def train_examples(self) -> int | None:
        """None: unknown (a stream): give loop.steps_per_epoch."""
        ...

    @property
    def shard_policy(self) -> str:
        """How MultiWorkerMirrored workers split the training set: "FILE" or "DATA"."""
        ...

    @property
    def epoch_read_when_iterated(self) -> bool:
        """Whether train_dataset(first_epoch=<an int64 tf.Variable>) reads the epoch each time an iterator starts, so
        that one dataset serves every epoch of loop=for_in; False: it takes a number, one dataset per epoch."""
        ...

    def train_dataset(
        self,
        batch_size: int,
        seed: Any,
        first_epoch: int = 1,
        epochs: int | None = 1,
        skip_batches: int = 0,
        input_context: Any = None,
    ) -> Any: ...

    def test_dataset(self, batch_size: int) -> Any: ...

    def validation_dataset(self, batch_size: int) -> Any:
        """Batches of the validation split, or None without one."""
        ...

    @property
    def has_validation(self) -> bool:
        """Whether there is a validation split (validation_dataset gives batches)."""
        ...

    def validation_split(self) -> dict[str, list] | None:
        """What the runner held out as the validation split (a fraction or a fold): {"examples": indices into the
        training examples} or {"files": the files}; None where it held out nothing."""
        ...

    def inputs(self) -> list[dict[str, Any]]: ...

    def raw_examples(self, count: int) -> Any: ...


def describe_spec(
    name: str,
    example_shape: tuple[int, ...],
    dtype: Any,
    num_classes: int,
    scale: float,
    output_shape: tuple[int, ...] = (),
) -> DataSpec:
    """Examples of rank 2 (grey images) get a channel axis for the model; the served model takes them as they are.
    `output_shape`: the model's for one example, where it is not (num_classes,)."""
    raw_shape = tuple(int(d) for d in example_shape)
    input_shape = (*raw_shape, 1) if len(raw_shape) == 2 else raw_shape
    return DataSpec(
        name=name,
        input_shape=input_shape,
        num_classes=int(num_classes),
        raw_shape=raw_shape,
        raw_dtype=np.dtype(dtype).name,
        scale=float(scale),
        output_shape=tuple(int(size) for size in output_shape),
    )

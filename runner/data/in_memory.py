"""Data held in memory (the built-in sets, .npz files, a callable's arrays) and the tf.data pipelines the
loop distributes: a fresh permutation per epoch drawn from (seed, epoch) alone, batches by the global batch,
prefetch."""

from __future__ import annotations

import functools
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from runner.data.source import DataSpec


@dataclass(frozen=True)
class InMemoryData:
    """Inputs as float32 scaled by the spec's scale, with their channel axis; labels as int64."""

    spec: DataSpec
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    # What they are, computed in the background (runner.data.describe): one description per split.
    descriptions: Future | None = field(default=None, compare=False, repr=False)
    shard_policy: str = "DATA"  # in-memory tensors have no files to shard by: workers shard by example
    # The validation split (dataset.validation_fraction, or the callable's own), scaled like the others; None: none.
    validation_images: np.ndarray | None = None
    validation_labels: np.ndarray | None = None
    # The training examples' indices in the data as loaded (after the prefix), when a validation split was held
    # out of it (runner.data.validation): what a run logs so the split can be checked.
    validation_indices: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def train_examples(self) -> int:
        return len(self.train_labels)

    def inputs(self) -> list[dict[str, Any]]:
        """The training and evaluation data's descriptions (waits for their digests)."""
        return [] if self.descriptions is None else self.descriptions.result()

    def raw_examples(self, count: int) -> np.ndarray:
        """The first `count` test inputs as the data holds them (the served model's input)."""
        return to_raw(self.test_images[:count], self.spec)

    # train_dataset(first_epoch=<tf.Variable>) reads the variable when an iterator starts, so that one dataset serves
    # every epoch (loop=for_in).
    epoch_read_when_iterated = True

    def train_dataset(
        self,
        batch_size: int,
        seed,
        first_epoch: int | tf.Variable = 1,
        epochs: int | None = 1,
        skip_batches: int = 0,
        input_context: tf.distribute.InputContext | None = None,
    ) -> tf.data.Dataset:
        """Batches of `batch_size` for epochs first_epoch, first_epoch+1, ... (`epochs` of them; None = endless),
        less the first `skip_batches` (skipped as indices, before any input is gathered).

        Each epoch is a fresh permutation of the training set drawn from (seed, epoch) alone, so epoch e
        sees the same batches whether the run started at epoch 1 or resumed at e (`seed` may also be an
        int64 tensor, computed where the dataset is built; `first_epoch` an int64 tf.Variable, read each
        time an iterator over the dataset starts). Every epoch ends with its own (possibly partial) batch,
        as the tutorial's `for x in dataset` does. With an `input_context` (distribute_datasets_from_function),
        each input pipeline takes its shard.
        """
        count = len(self.train_labels)
        images, labels = self._train_tensors if tf.executing_eagerly() else self._fresh_train_tensors()

        def epoch_batches(epoch):
            order = tf.random.experimental.index_shuffle(
                tf.range(count, dtype=tf.int64), seed=tf.stack([tf.cast(seed, tf.int64), epoch]), max_index=count - 1
            )
            indices = tf.data.Dataset.from_tensor_slices(order)
            if input_context is not None:
                indices = indices.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
            return indices.batch(batch_size)

        # Epochs first_epoch, first_epoch + 1, ...: offsets added in a map, so that a tf.Variable first_epoch is read
        # whenever an iterator starts (loop=for_in builds this dataset once and sets the epoch before each pass).
        offsets = tf.data.Dataset.range(epochs if epochs is not None else 2**62)
        epoch_numbers = offsets.map(lambda offset: offset + tf.cast(first_epoch, tf.int64))
        dataset = epoch_numbers.flat_map(epoch_batches).skip(skip_batches)
        # One gather per batch from tensors already in memory: no per-example work in the pipeline.
        dataset = dataset.map(
            lambda index: (tf.gather(images, index), tf.gather(labels, index)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        return with_options(dataset.prefetch(tf.data.AUTOTUNE), "DATA")

    def _fresh_train_tensors(self) -> tuple[tf.Tensor, tf.Tensor]:
        return tf.constant(self.train_images), tf.constant(self.train_labels)

    @functools.cached_property
    def _train_tensors(self) -> tuple[tf.Tensor, tf.Tensor]:
        """The training arrays as tensors, copied once: `loop=for_in` builds a dataset every epoch, and copied
        every epoch they cost that epoch a copy of the whole training set. (A dataset built inside a function,
        a ParameterServer worker's, takes constants of its own.)"""
        return self._fresh_train_tensors()

    def test_dataset(self, batch_size: int) -> tf.data.Dataset:
        dataset = tf.data.Dataset.from_tensor_slices((self.test_images, self.test_labels))
        return with_options(dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE), "DATA")

    def validation_split(self) -> dict[str, list] | None:
        if self.validation_indices is None:
            return None
        return {"examples": [int(index) for index in self.validation_indices]}

    @property
    def has_validation(self) -> bool:
        return self.validation_images is not None

    def validation_dataset(self, batch_size: int) -> tf.data.Dataset | None:
        if self.validation_images is None:
            return None
        dataset = tf.data.Dataset.from_tensor_slices((self.validation_images, self.validation_labels))
        return with_options(dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE), "DATA")


def to_model_input(raw: np.ndarray, spec: DataSpec) -> np.ndarray:
    """Raw inputs (n, *raw_shape) as the model trains on them: float32 divided by the scale, shaped
    (n, *input_shape). The float32 division is the one the exported model's Normalization layer computes."""
    return (raw.astype(np.float32) / np.float32(spec.scale)).reshape((-1, *spec.input_shape))


def to_raw(inputs: np.ndarray, spec: DataSpec) -> np.ndarray:
    """Model inputs back as the data holds them (exact for integer raw values)."""
    raw = inputs.reshape((-1, *spec.raw_shape)) * np.float32(spec.scale)
    if np.issubdtype(np.dtype(spec.raw_dtype), np.integer):
        raw = np.rint(raw)
    return raw.astype(spec.raw_dtype)


def with_options(dataset: tf.data.Dataset, shard_policy: str) -> tf.data.Dataset:
    options = tf.data.Options()
    # How MultiWorkerMirrored workers split the data: by FILE (each reads its own files) or DATA (each
    # reads everything and keeps its share of the examples).
    options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, shard_policy)
    # Elements in their order, whatever the timing of the parallel map's threads (TensorFlow's default,
    # stated here because the reproducibility of runtime.deterministic rests on it).
    options.deterministic = True
    return dataset.with_options(options)


def batches_per_epoch(examples: int, global_batch: int) -> int:
    return -(-examples // global_batch)

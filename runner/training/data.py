"""Training and test data: Fashion-MNIST from IDX files or tf.keras.datasets, or synthetic arrays,
the tf.data pipelines the loop distributes (shuffle, batch by the global batch, prefetch), and the
description of what was loaded (name, digest, source) that a tracker records as the run's dataset inputs."""

from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from runner.errors import RunnerError
from runner.settings import DatasetSettings

IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
# Raw pixels (uint8 in the IDX files) are divided by this before training; runner.training.model's
# with_raw_image_input does the same inside an exported model.
PIXEL_MAX = 255.0
IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
               0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


@dataclass(frozen=True)
class Arrays:
    """Images as float32 in [0, 1] with shape (n, 28, 28, 1); labels as int64."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    # What they are, computed in the background (see describe): one description per split.
    descriptions: Future | None = field(default=None, compare=False, repr=False)

    def inputs(self) -> list[dict[str, Any]]:
        """The training and evaluation data's descriptions (waits for their digests)."""
        return [] if self.descriptions is None else self.descriptions.result()


def read_idx(path: str) -> np.ndarray:
    """Read one IDX file (optionally gzipped) into an array of its declared type and shape."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            raw = handle.read()
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise RunnerError(
            f"{path} is not a readable gzip file ({error}). Fix: replace it with an intact copy of the "
            "Fashion-MNIST file of that name, or give it without the .gz suffix if it is not compressed."
        ) from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise RunnerError(
            f"{path} is not an IDX file (bad magic number {raw[:4].hex() or 'empty'}). Fix: point "
            "dataset.dir at the original Fashion-MNIST files (train-images-idx3-ubyte.gz, ...)."
        )
    dtype, ndim = np.dtype(_IDX_DTYPES[raw[2]]), raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(raw) != expected:
        raise RunnerError(
            f"{path} is truncated or malformed: its header declares shape {shape} ({expected} bytes) "
            f"but the file holds {len(raw)} bytes. Fix: replace it with an intact copy."
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def _find_idx(directory: str, stem: str) -> str:
    for candidate in (stem + ".gz", stem):
        path = os.path.join(directory, candidate)
        if os.path.exists(path):
            return path
    raise RunnerError(
        f"dataset.dir={directory!r} has no {stem}.gz (nor {stem}). Fix: point dataset.dir at a directory "
        f"holding all four Fashion-MNIST IDX files: {', '.join(f + '.gz' for f in IDX_FILES.values())}."
    )


def load_idx_directory(directory: str) -> tuple[np.ndarray, ...]:
    """(train_images, train_labels, test_images, test_labels) from the four IDX files in a directory."""
    arrays = [read_idx(_find_idx(directory, stem)) for stem in IDX_FILES.values()]
    for images, labels, split in ((arrays[0], arrays[1], "train"), (arrays[2], arrays[3], "test")):
        if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE[:2] or labels.shape != images.shape[:1]:
            raise RunnerError(
                f"dataset.dir={directory!r}: the {split} files hold images {images.shape} and labels "
                f"{labels.shape}; expected (n, 28, 28) images and n labels. Fix: use Fashion-MNIST's own files."
            )
    return tuple(arrays)


def keras_cache_dir() -> str:
    """Where tf.keras.datasets.fashion_mnist keeps its files (tf_keras's get_file default)."""
    return os.path.join(os.path.expanduser("~"), ".keras", "datasets", "fashion-mnist")


def _load_keras_fashion_mnist() -> tuple[np.ndarray, ...]:
    try:
        (train_x, train_y), (test_x, test_y) = tf.keras.datasets.fashion_mnist.load_data()
    except Exception as error:  # the download raises anything from URLError to a bad-gzip error
        raise RunnerError(
            f"tf.keras.datasets.fashion_mnist.load_data() could not load Fashion-MNIST ({error}). "
            "Fix: set dataset.dir to a directory holding the four IDX files, or copy them to "
            "~/.keras/datasets/fashion-mnist/."
        ) from None
    return train_x, train_y, test_x, test_y


def _synthetic(settings: DatasetSettings, seed: int) -> tuple[np.ndarray, ...]:
    """Noisy copies of one random prototype per class: random, yet learnable in a few steps."""
    rng = np.random.default_rng(seed)
    prototypes = rng.uniform(0, 255, size=(NUM_CLASSES, *IMAGE_SHAPE[:2]))

    def split(count: int):
        labels = rng.integers(0, NUM_CLASSES, size=count)
        noise = rng.normal(0, 64, size=(count, *IMAGE_SHAPE[:2]))
        return np.clip(prototypes[labels] + noise, 0, 255).astype(np.uint8), labels.astype(np.uint8)

    return (*split(settings.train_examples or 2048), *split(settings.test_examples or 512))


def load_arrays(settings: DatasetSettings, seed: int) -> Arrays:
    """Load, take the configured prefixes, scale to [0, 1] and add the channel axis."""
    if settings.name == "synthetic":
        raw = _synthetic(settings, seed)
    elif settings.dir is not None:
        raw = load_idx_directory(settings.dir)
    else:
        raw = _load_keras_fashion_mnist()
    train_x, train_y, test_x, test_y = raw
    train_x, train_y = train_x[: settings.train_examples], train_y[: settings.train_examples]
    test_x, test_y = test_x[: settings.test_examples], test_y[: settings.test_examples]
    # Hashing the raw bytes (sha256 releases the GIL) overlaps with building the model and the first steps.
    descriptions = _DESCRIBING.submit(describe, settings, seed, (train_x, train_y), (test_x, test_y))

    def images(x: np.ndarray) -> np.ndarray:
        return (x.astype(np.float32) / np.float32(PIXEL_MAX))[..., None]

    return Arrays(images(train_x), train_y.astype(np.int64), images(test_x), test_y.astype(np.int64), descriptions)


_DESCRIBING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runner-data-digest")


def describe(settings: DatasetSettings, seed: int, train: tuple[np.ndarray, np.ndarray],
             test: tuple[np.ndarray, np.ndarray]) -> list[dict[str, Any]]:
    """The training and evaluation data as MLflow dataset inputs describe them, without MLflow: name, digest
    (sha256 of the images and labels as loaded, so a different prefix or seed is a different digest), source
    (the IDX directory, the tf.keras cache, or the synthetic generator with its seed), shapes and context."""
    if settings.name == "synthetic":
        source_type, source = "code", {"tags": {"mlflow.source.name": "synthetic", "seed": str(seed)}}
    else:
        directory = os.path.abspath(settings.dir) if settings.dir is not None else keras_cache_dir()
        source_type, source = "local", {"uri": directory}
    return [{"name": f"{settings.name}-{split}", "context": context, "digest": digest(images, labels),
             "source_type": source_type, "source": source, "features": _spec(images), "targets": _spec(labels)}
            for split, context, (images, labels) in (("train", "training", train), ("test", "evaluation", test))]


def digest(*arrays: np.ndarray) -> str:
    """16 hex digits of sha256 over each array's dtype, shape and bytes."""
    hashed = hashlib.sha256()
    for array in arrays:
        hashed.update(f"{array.dtype.str}{array.shape}".encode())
        hashed.update(memoryview(np.ascontiguousarray(array)).cast("B"))
    return hashed.hexdigest()[:16]


def _spec(array: np.ndarray) -> dict[str, Any]:
    return {"dtype": array.dtype.name, "shape": list(array.shape), "nbytes": int(array.nbytes)}


def raw_images(images: np.ndarray) -> np.ndarray:
    """Images as load_arrays returns them, back as the IDX files hold them: uint8, shape (n, 28, 28)."""
    return np.rint(images[..., 0] * np.float32(PIXEL_MAX)).astype(np.uint8)


def _with_options(dataset: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    # In-memory tensors have no files to shard by: multi-worker strategies shard by element.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    # Elements in their order, whatever the timing of the parallel map's threads (TensorFlow's default,
    # stated here because the reproducibility of runtime.deterministic rests on it).
    options.deterministic = True
    return dataset.with_options(options)


def train_dataset(arrays: Arrays, batch_size: int, seed: int, first_epoch: int = 1, epochs: int | None = 1,
                  skip_batches: int = 0, input_context: tf.distribute.InputContext | None = None
                  ) -> tf.data.Dataset:
    """Batches of `batch_size` for epochs first_epoch, first_epoch+1, ... (`epochs` of them; None = endless),
    less the first `skip_batches` (skipped as indices, before any image is gathered).

    Each epoch is a fresh permutation of the training set drawn from (seed, epoch) alone, so epoch e
    sees the same batches whether the run started at epoch 1 or resumed at e (`seed` may also be an
    int64 tensor, computed where the dataset is built). Every epoch ends with
    its own (possibly partial) batch, as the tutorial's `for x in dataset` does. With an
    `input_context` (distribute_datasets_from_function), each input pipeline takes its shard.
    """
    count = len(arrays.train_labels)
    images, labels = tf.constant(arrays.train_images), tf.constant(arrays.train_labels)

    def epoch_batches(epoch):
        order = tf.random.experimental.index_shuffle(
            tf.range(count, dtype=tf.int64), seed=tf.stack([tf.cast(seed, tf.int64), epoch]),
            max_index=count - 1)
        indices = tf.data.Dataset.from_tensor_slices(order)
        if input_context is not None:
            indices = indices.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return indices.batch(batch_size)

    epoch_numbers = tf.data.Dataset.range(first_epoch, first_epoch + epochs) if epochs is not None \
        else tf.data.Dataset.range(first_epoch, 2**62)
    dataset = epoch_numbers.flat_map(epoch_batches).skip(skip_batches)
    # One gather per batch from tensors already in memory: no per-example work in the pipeline.
    dataset = dataset.map(lambda index: (tf.gather(images, index), tf.gather(labels, index)),
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return _with_options(dataset.prefetch(tf.data.AUTOTUNE))


def test_dataset(arrays: Arrays, batch_size: int) -> tf.data.Dataset:
    dataset = tf.data.Dataset.from_tensor_slices((arrays.test_images, arrays.test_labels))
    return _with_options(dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE))


def batches_per_epoch(examples: int, global_batch: int) -> int:
    return -(-examples // global_batch)

"""The contract between a dataset callable and the runner.

A dataset option's `_target_` is called with its own arguments from the config (and `seed=`, when it takes
one) and returns DataSplits: the training and test data, as (inputs, labels) NumPy arrays or as tf.data
datasets of unbatched (input, label) pairs, and what the runner cannot read off them. A callable may also
return Keras's own shape, `((x_train, y_train), (x_test, y_test))`.

Inputs are raw values (e.g. uint8 pixels): the runner divides them by `dataset.scale` for training, and the
logged model does the same inside, so it serves the raw values the files hold. Examples of rank 2 (grey
images, (height, width)) get a channel axis for the model; the served model takes them without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence


@dataclass(frozen=True)
class DataSplits:
    """What a dataset callable returns."""

    train: Any  # (inputs, labels) arrays, or a tf.data.Dataset of unbatched (input, label) pairs
    test: Any
    num_classes: int | None = None  # None: the largest label + 1 (arrays only)
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
class DataSpec:
    """What the model, the loss and the exported model need to know about the data."""

    name: str
    input_shape: tuple[int, ...]  # one example as the model sees it
    num_classes: int
    raw_shape: tuple[int, ...]  # one example as the data holds it: the served model's input
    raw_dtype: str  # e.g. "uint8"
    scale: float  # training inputs are the raw values divided by this


class TrainingData(Protocol):
    """What the training loop needs of a dataset, wherever its examples live."""

    spec: DataSpec
    train_examples: int | None  # None: unknown (a stream): give loop.steps_per_epoch
    shard_policy: str  # how MultiWorkerMirrored workers split the training set: "FILE" or "DATA"

    def train_dataset(self, batch_size: int, seed: Any, first_epoch: int = 1, epochs: int | None = 1,
                      skip_batches: int = 0, input_context: Any = None) -> Any: ...

    def test_dataset(self, batch_size: int) -> Any: ...

    def inputs(self) -> list[dict[str, Any]]: ...

    def raw_examples(self, count: int) -> Any: ...

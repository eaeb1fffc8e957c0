"""A dataset option's `_target_`, called and turned into the TrainingData the loop distributes."""

from __future__ import annotations

import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from runner.config.components import DATASET_ARGUMENTS, call
from runner.config.schema import DatasetSettings
from runner.data.describe import describe_arrays, source_of
from runner.data.in_memory import InMemoryData, to_model_input
from runner.data.source import DataSplits, TrainingData, describe_spec
from runner.data.streaming import streamed
from runner.data.validation import check_one_way, fold_split, split_examples
from runner.errors import RunnerError

_DESCRIBING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runner-data-digest")


def load_data(settings: DatasetSettings, seed: int, workers: int = 1) -> TrainingData:
    """Call the dataset's callable and keep the configured prefixes of what it returns; `workers`: the
    MultiWorkerMirrored workers that split the training set (a stream with fewer files shards by example)."""
    key = "dataset._target_"
    function = settings.component.resolve()
    accepted = _accepted(function)
    # The run's seed, and the prefix sizes (so a generator or a reader can make or read only that many).
    offered = dict(zip(DATASET_ARGUMENTS, (seed, settings.train_examples, settings.test_examples), strict=True))
    supplied = {name: value for name, value in offered.items() if value is not None and name in accepted}
    splits = as_splits(
        call(key, settings.component.target, lambda: settings.component.instantiate(**supplied)),
        settings.component.target,
    )
    if _is_arrays(splits.train) and _is_arrays(splits.test):
        return in_memory(settings, splits, seed)
    if _is_arrays(splits.train) or _is_arrays(splits.test):
        raise RunnerError(
            f"{key}={settings.component.target!r} returned arrays for one split and a dataset for the "
            "other. Fix: return both splits the same way: (inputs, labels) arrays, or tf.data datasets."
        )
    return streamed(settings, splits, seed, workers)


def _accepted(function) -> set[str]:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return set()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return set()  # **kwargs: pass only what the config gives
    return {p.name for p in parameters}


def _is_arrays(split: Any) -> bool:
    return isinstance(split, (tuple, list)) and len(split) == 2 and all(isinstance(a, np.ndarray) for a in split)


def as_splits(result: Any, target: str) -> DataSplits:
    """DataSplits, or Keras's ((x_train, y_train), (x_test, y_test))."""
    if isinstance(result, DataSplits):
        return result
    if isinstance(result, (tuple, list)) and len(result) == 2 and all(_is_arrays(part) for part in result):
        return DataSplits(tuple(result[0]), tuple(result[1]))
    raise RunnerError(
        f"dataset._target_={target!r} returned {type(result).__name__}, not the training and test data. Fix: return "
        "runner.data.source.DataSplits(train=(x_train, y_train), test=(x_test, y_test), num_classes=...) with NumPy "
        "arrays or tf.data datasets of (input, label) pairs, or ((x_train, y_train), (x_test, y_test))."
    )


def check_labels(split: str, labels: np.ndarray, num_classes: int, target: str) -> None:
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise RunnerError(
            f"dataset._target_={target!r}: the {split} labels run from {labels.min()} to {labels.max()}, outside 0.."
            f"{num_classes - 1} for num_classes={num_classes}. Fix: give integer class indices 0..num_classes-1, "
            "or the right num_classes."
        )


def in_memory(settings: DatasetSettings, splits: DataSplits, seed: int) -> InMemoryData:
    target = settings.component.target
    (train_x, train_y), (test_x, test_y) = splits.train, splits.test
    for split, inputs, labels in (("training", train_x, train_y), ("test", test_x, test_y)):
        if inputs.ndim < 2 or labels.ndim != 1 or len(inputs) != len(labels) or not len(labels):
            raise RunnerError(
                f"dataset._target_={target!r}: the {split} split holds inputs of shape {inputs.shape} and labels of "
                f"shape {labels.shape}; expected (n, ...) inputs and n labels, n > 0. Fix: return one label per "
                "example."
            )
        if not np.issubdtype(labels.dtype, np.integer):
            raise RunnerError(
                f"dataset._target_={target!r}: the {split} labels are {labels.dtype}, not integers. "
                "Fix: give integer class indices 0..num_classes-1."
            )
    if train_x.shape[1:] != test_x.shape[1:]:
        raise RunnerError(
            f"dataset._target_={target!r}: training inputs are shaped {train_x.shape[1:]} and test "
            f"inputs {test_x.shape[1:]}. Fix: give both splits examples of one shape."
        )
    train_x, train_y = train_x[: settings.train_examples], train_y[: settings.train_examples]
    test_x, test_y = test_x[: settings.test_examples], test_y[: settings.test_examples]
    validation, held_out = _validation_arrays(settings, splits, train_x, train_y, seed)
    if held_out is not None:
        train_x, train_y = train_x[held_out[0]], train_y[held_out[0]]
    largest = max(int(labels.max()) for labels in (train_y, test_y, *(validation[1:] if validation else ())))
    num_classes = splits.num_classes if splits.num_classes is not None else largest + 1
    for split, labels in (
        ("training", train_y),
        ("test", test_y),
        *((("validation", validation[1]),) if validation else ()),
    ):
        check_labels(split, labels, num_classes, target)
    spec = describe_spec(settings.name, train_x.shape[1:], train_x.dtype, num_classes, settings.scale)
    # Hashing the raw bytes (sha256 releases the GIL) overlaps with building the model and the first steps.
    descriptions = _DESCRIBING.submit(
        describe_arrays,
        settings.name,
        *source_of(splits.source, settings.name, seed),
        (train_x, train_y),
        (test_x, test_y),
        validation,
    )
    return InMemoryData(
        spec,
        to_model_input(train_x, spec),
        train_y.astype(np.int64),
        to_model_input(test_x, spec),
        test_y.astype(np.int64),
        descriptions,
        validation_images=to_model_input(validation[0], spec) if validation else None,
        validation_labels=validation[1].astype(np.int64) if validation else None,
        validation_indices=held_out[1] if held_out is not None else None,
    )


def _validation_arrays(
    settings: DatasetSettings, splits: DataSplits, train_x: np.ndarray, train_y: np.ndarray, seed: int
) -> tuple[tuple[np.ndarray, np.ndarray] | None, tuple[np.ndarray, np.ndarray] | None]:
    """The validation split's (inputs, labels): the callable's own, or dataset.validation_fraction of the training
    examples; and, when held out here, the (training, validation) indices into the training examples."""
    target = settings.component.target
    check_one_way(settings.validation_fraction, settings.folds)
    split_seed = settings.split_seed if settings.split_seed is not None else seed
    if settings.folds is not None:  # cross-validation: the fold is the validation split, whatever the callable gives
        training, held = fold_split(train_y, settings.folds, settings.fold, split_seed, target)
        return (train_x[held], train_y[held]), (training, held)
    if splits.validation is not None:
        if not _is_arrays(splits.validation):
            raise RunnerError(
                f"dataset._target_={target!r} returned arrays for the training split and a "
                f"{type(splits.validation).__name__} as the validation split. Fix: return the validation split "
                "as the training split is returned, (inputs, labels) NumPy arrays."
            )
        inputs, labels = splits.validation
        if inputs.shape[1:] != train_x.shape[1:] or labels.ndim != 1 or len(inputs) != len(labels) or not len(labels):
            raise RunnerError(
                f"dataset._target_={target!r}: the validation split holds inputs of shape {inputs.shape} and labels "
                f"of shape {labels.shape}; expected (n, {', '.join(map(str, train_x.shape[1:]))}) inputs and n > 0 "
                "labels. Fix: give the validation split examples shaped like the training examples."
            )
        return (inputs, labels), None
    if settings.validation_fraction is None:
        return None, None
    training, validation = split_examples(train_y, settings.validation_fraction, split_seed, target)
    return (train_x[validation], train_y[validation]), (training, validation)

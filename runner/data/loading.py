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
from runner.task_kinds import KINDS, TaskKind, kind_named

_DESCRIBING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runner-data-digest")


def load_data(settings: DatasetSettings, seed: int, workers: int = 1, task: str = "classification") -> TrainingData:
    """Call the dataset's callable and keep the configured prefixes of what it returns, its labels checked and
    shaped for `task` (task.kind: runner.task_kinds); `workers`: the MultiWorkerMirrored workers that split the
    training set (a stream with fewer files shards by example)."""
    key = "dataset._target_"
    kind = kind_named(task)
    function = settings.component.resolve()
    accepted = _accepted(function)
    # The run's seed, the prefix sizes (so a generator or a reader can make or read only that many), the task.
    offered = dict(zip(DATASET_ARGUMENTS, (seed, settings.train_examples, settings.test_examples, task), strict=True))
    supplied = {name: value for name, value in offered.items() if value is not None and name in accepted}
    splits = as_splits(
        call(key, settings.component.target, lambda: settings.component.instantiate(**supplied)),
        settings.component.target,
    )
    if _is_arrays(splits.train) and _is_arrays(splits.test):
        return in_memory(settings, splits, seed, kind)
    if _is_arrays(splits.train) or _is_arrays(splits.test):
        raise RunnerError(
            f"{key}={settings.component.target!r} returned arrays for one split and a dataset for the "
            "other. Fix: return both splits the same way: (inputs, labels) arrays, or tf.data datasets."
        )
    return streamed(settings, splits, seed, workers, kind)


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


def in_memory(
    settings: DatasetSettings, splits: DataSplits, seed: int, kind: TaskKind = KINDS["classification"]
) -> InMemoryData:
    target = settings.component.target
    where = f"dataset._target_={target!r}"
    (train_x, train_y), (test_x, test_y) = splits.train, splits.test
    for split, inputs, labels in (("training", train_x, train_y), ("test", test_x, test_y)):
        if inputs.ndim < 2 or labels.ndim < 1 or len(inputs) != len(labels) or not len(labels):
            raise RunnerError(
                f"{where}: the {split} split holds inputs of shape {inputs.shape} and labels of "
                f"shape {labels.shape}; expected (n, ...) inputs and n labels, n > 0. Fix: return one label per "
                "example."
            )
    if train_x.shape[1:] != test_x.shape[1:]:
        raise RunnerError(
            f"dataset._target_={target!r}: training inputs are shaped {train_x.shape[1:]} and test "
            f"inputs {test_x.shape[1:]}. Fix: give both splits examples of one shape."
        )
    # The prefixes first: only the labels a run trains and scores on are checked and converted.
    train_x, train_y = train_x[: settings.train_examples], train_y[: settings.train_examples]
    test_x, test_y = test_x[: settings.test_examples], test_y[: settings.test_examples]
    train_y, test_y = kind.prepare(where, "training", train_y), kind.prepare(where, "test", test_y)
    validation, held_out = _validation_arrays(settings, splits, train_x, train_y, seed, kind)
    if held_out is not None:
        train_x, train_y = train_x[held_out[0]], train_y[held_out[0]]
    labelled = (("training", train_y), ("test", test_y), *((("validation", validation[1]),) if validation else ()))
    num_classes = None
    if kind.class_indices:
        largest = max(int(labels.max()) for _, labels in labelled)
        num_classes = splits.num_classes if splits.num_classes is not None else largest + 1
        for split, labels in labelled:
            check_labels(split, labels, num_classes, target)
    else:
        _check_label_shapes(where, labelled)
    outputs = kind.output_shape(train_y, num_classes)
    spec = describe_spec(settings.name, train_x.shape[1:], train_x.dtype, outputs[-1], settings.scale, outputs)
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
        train_y,
        to_model_input(test_x, spec),
        test_y,
        descriptions,
        validation_images=to_model_input(validation[0], spec) if validation else None,
        validation_labels=validation[1] if validation else None,
        validation_indices=held_out[1] if held_out is not None else None,
    )


def _check_label_shapes(where: str, labelled: tuple[tuple[str, np.ndarray], ...]) -> None:
    """Every split's labels shaped alike for one example (a model has one output shape)."""
    first, shape = labelled[0][0], labelled[0][1].shape[1:]
    for split, labels in labelled[1:]:
        if labels.shape[1:] != shape:
            raise RunnerError(
                f"{where}: the {first} labels are shaped {shape} per example and the {split} labels "
                f"{labels.shape[1:]}. Fix: give every split's examples labels of one shape."
            )


def _validation_arrays(
    settings: DatasetSettings,
    splits: DataSplits,
    train_x: np.ndarray,
    train_y: np.ndarray,
    seed: int,
    kind: TaskKind,
) -> tuple[tuple[np.ndarray, np.ndarray] | None, tuple[np.ndarray, np.ndarray] | None]:
    """The validation split's (inputs, labels, shaped for the task): the callable's own, or
    dataset.validation_fraction of the training examples, stratified where the task's labels are classes; and, when
    held out here, the (training, validation) indices into the training examples."""
    target = settings.component.target
    check_one_way(settings.validation_fraction, settings.folds)
    split_seed = settings.split_seed if settings.split_seed is not None else seed
    if settings.folds is not None:  # cross-validation: the fold is the validation split, whatever the callable gives
        training, held = fold_split(kind.strata(train_y), settings.folds, settings.fold, split_seed, target)
        return (train_x[held], train_y[held]), (training, held)
    if splits.validation is not None:
        if not _is_arrays(splits.validation):
            raise RunnerError(
                f"dataset._target_={target!r} returned arrays for the training split and a "
                f"{type(splits.validation).__name__} as the validation split. Fix: return the validation split "
                "as the training split is returned, (inputs, labels) NumPy arrays."
            )
        inputs, labels = splits.validation
        if inputs.shape[1:] != train_x.shape[1:] or labels.ndim < 1 or len(inputs) != len(labels) or not len(labels):
            raise RunnerError(
                f"dataset._target_={target!r}: the validation split holds inputs of shape {inputs.shape} and labels "
                f"of shape {labels.shape}; expected (n, {', '.join(map(str, train_x.shape[1:]))}) inputs and n > 0 "
                "labels. Fix: give the validation split examples shaped like the training examples."
            )
        return (inputs, kind.prepare(f"dataset._target_={target!r}", "validation", labels)), None
    if settings.validation_fraction is None:
        return None, None
    training, validation = split_examples(kind.strata(train_y), settings.validation_fraction, split_seed, target)
    return (train_x[validation], train_y[validation]), (training, validation)

"""The validation split: a fraction of the training examples (or files) held out, stratified by label and drawn
from the split seed alone, so every configuration and seed replicate of a sweep is compared on the same examples.

Written with NumPy rather than a library's splitter: the split is part of what a run's results mean, so it must
not change when a library's version does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from runner.errors import RunnerError

# Set by a sweep job for the training process it starts when it gave the run the sweep's default fraction
# (runner.sweeps.job.job): data the runner cannot split then trains without a validation split instead of refusing,
# and the sweep chooses on the test set and says so.
OPTIONAL_VARIABLE = "RUNNER_VALIDATION_OPTIONAL"
KEY = "dataset.validation_fraction"
# The run's artifact naming what was held out: {"examples": indices into the training examples} or {"files": [...]}.
VALIDATION_SPLIT_FILE = "validation_split.json"


def validation_optional(environ=os.environ) -> bool:
    return environ.get(OPTIONAL_VARIABLE) == "1"


def held_out(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """The indices (ascending) of the examples held out: round(fraction * n) of each label's n examples, drawn
    by a generator seeded with `seed` alone."""
    rng = np.random.default_rng([int(seed), 0x5A11D])  # its own stream: not the one that draws the weights
    chosen = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        count = int(np.floor(fraction * len(members) + 0.5))
        chosen.append(rng.permutation(members)[:count])
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, np.int64)


def _partition(keys: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, str | None]:
    """(training, validation) indices of `keys` held out by held_out(), and which of the two is empty, if one is."""
    validation = held_out(keys, fraction, seed)
    training = np.setdiff1d(np.arange(len(keys)), validation, assume_unique=True)
    emptied = "validation" if not len(validation) else "training" if not len(training) else None
    return training, validation, emptied


def split_examples(labels: np.ndarray, fraction: float, seed: int, target: str) -> tuple[np.ndarray, np.ndarray]:
    """(training indices, validation indices), both ascending and disjoint, covering every example; refused when
    either would be empty."""
    training, validation, emptied = _partition(labels, fraction, seed)
    if emptied:
        raise RunnerError(
            f"{KEY}={fraction!r} is not valid for dataset._target_={target!r}: of its {len(labels)} training "
            f"examples it would leave the {emptied} split empty. Fix: pick a fraction that holds out at least one "
            "example and keeps at least one, or use more training examples.",
            key=KEY,
        )
    return training, validation


def split_files(
    files: Sequence[str], labels: Sequence[int] | None, fraction: float, seed: int, target: str
) -> tuple[np.ndarray, np.ndarray]:
    """(training, validation) indices into `files`, whole files each: stratified by label when each file is one
    labelled example (an image folder), else round(fraction * files) files (TFRecord shards)."""
    if len(files) < 2:
        raise RunnerError(
            f"{KEY}={fraction!r} is not valid for dataset._target_={target!r}: its training data is "
            f"{len(files)} file, and file data is split by whole files. Fix: write the training data as two or "
            f"more files (e.g. TFRecord shards), or leave {KEY} null.",
            key=KEY,
        )
    keys = np.asarray(labels if labels is not None else np.zeros(len(files), np.int64))
    training, validation, emptied = _partition(keys, fraction, seed)
    if emptied:
        raise RunnerError(
            f"{KEY}={fraction!r} is not valid for dataset._target_={target!r}: its training data is "
            f"{len(files)} files, split by whole files, and the fraction would leave the {emptied} split with "
            "none. Fix: pick a fraction that holds out at least one file and keeps at least one, or write the "
            "training data as more files.",
            key=KEY,
        )
    return training, validation


# ---- k-fold cross-validation (sweep.folds): fold k of K held out as the validation split ----
FOLDS_KEY = "dataset.folds"


def fold_assignment(labels: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Each example's fold: each label's examples, in an order drawn from `seed` alone, dealt to the folds in turn
    (continuing from one label to the next), so each fold holds every label's share within one example and the
    folds' sizes differ by at most one."""
    rng = np.random.default_rng([int(seed), 0xF01D5])
    assignment = np.zeros(len(labels), np.int64)
    dealt = 0
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        assignment[members] = (dealt + np.arange(len(members))) % folds
        dealt += len(members)
    return assignment


def fold_split(
    labels: np.ndarray, folds: int, fold: int, seed: int, target: str, what: str = "examples"
) -> tuple[np.ndarray, np.ndarray]:
    """(training indices, validation indices) of fold `fold` of `folds`, both ascending; `what`: "examples", or
    "files" for file data split by whole files."""
    if not 0 <= fold < folds:
        raise RunnerError(
            f"dataset.fold={fold!r} is not valid: {FOLDS_KEY}={folds} has folds 0 to {folds - 1}. Fix: pick a fold "
            f"from 0 to {folds - 1} (a sweep with sweep.folds sets it for each of its runs).",
            key="dataset.fold",
        )
    if len(labels) < folds:
        raise RunnerError(
            f"{FOLDS_KEY}={folds} (sweep.folds) is not valid for dataset._target_={target!r}: its training data is "
            f"{len(labels)} {what}, and each of {folds} folds needs at least one"
            + (", split by whole files" if what == "files" else "")
            + f". Fix: use sweep.folds={len(labels)} or fewer"
            + (", or write the training data as more files." if what == "files" else ", or more training examples."),
            key=FOLDS_KEY,
        )
    assignment = fold_assignment(labels, folds, seed)
    return np.flatnonzero(assignment != fold), np.flatnonzero(assignment == fold)


def check_one_way(fraction: float | None, folds: int | None) -> None:
    if fraction is not None and folds is not None:
        raise RunnerError(
            f"{KEY}={fraction!r} is not valid with {FOLDS_KEY}={folds} (sweep.folds): cross-validation holds out "
            f"one fold as the validation split. Fix: leave {KEY} null with sweep.folds, or drop sweep.folds.",
            key=KEY,
        )


def cannot_fold(target: str, folds: int) -> RunnerError:
    return RunnerError(
        f"{FOLDS_KEY}={folds} (sweep.folds) is not valid for dataset._target_={target!r}: it returns its training data "
        "as a tf.data dataset, which the runner cannot split into folds without reading it all. Fix: return NumPy "
        "arrays or FileRecords, or drop sweep.folds (a sweep then chooses on a validation split).",
        key=FOLDS_KEY,
    )


def cannot_split(target: str, fraction: float) -> RunnerError:
    return RunnerError(
        f"{KEY}={fraction!r} is not valid for dataset._target_={target!r}: it returns its training data as a "
        "tf.data dataset, which the runner cannot split without reading it all. Fix: return the validation data "
        "yourself, runner.data.source.DataSplits(train=..., test=..., validation=...), return NumPy arrays or "
        f"FileRecords instead, or leave {KEY} null.",
        key=KEY,
    )

"""The `npz` dataset kind: one NumPy .npz file holding x_train, y_train, x_test and y_test, loaded into memory."""

from __future__ import annotations

import os
import zipfile

import numpy as np

from runner.data.source import DataSplits
from runner.errors import RunnerError
from runner.task_kinds import kind_named

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
_FIX_KEYS = (
    "write the file with np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...): inputs shaped "
    "(n, ...) and one label per example (an integer class index for task=classification)"
)


def npz(path: str, num_classes: int | None = None, task: str = "classification") -> DataSplits:
    """The four arrays of `path`; num_classes: null = the largest label + 1 (for task=classification; the other
    tasks' labels are checked by the runner: runner.task_kinds)."""
    where = f"dataset.path={path!r}"
    full = _existing_file(where, path)
    arrays = _arrays(where, full)
    for split in ("train", "test"):
        _check_split(where, split, arrays[f"x_{split}"], arrays[f"y_{split}"], task)
    _check_example_shapes(where, arrays["x_train"], arrays["x_test"])
    classes = _classes(where, arrays, num_classes) if kind_named(task).class_indices else None
    return DataSplits(
        (arrays["x_train"], arrays["y_train"]),
        (arrays["x_test"], arrays["y_test"]),
        num_classes=classes,
        source={"uri": full},
    )


def _existing_file(where: str, path: str) -> str:
    """dataset.path as the absolute path of a file that is there."""
    if path is None:
        raise RunnerError(
            "dataset.path is missing: dataset=npz reads one .npz file. Fix: pass dataset.path=/path/to/data.npz."
        )
    if not isinstance(path, str) or not path:
        raise RunnerError(f"{where} is not a file's path. Fix: pass dataset.path=/path/to/data.npz.")
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise RunnerError(f"{where}: no such file ({full}). Fix: point dataset.path at an existing .npz file.")
    return full


def _arrays(where: str, full: str) -> dict[str, np.ndarray]:
    """The file's NPZ_KEYS arrays, read into memory."""
    try:
        with np.load(full, allow_pickle=False) as archive:
            missing = [key for key in NPZ_KEYS if key not in archive.files]
            if missing:
                raise RunnerError(
                    f"{where}: the file has no {', '.join(missing)} (it holds "
                    f"{', '.join(archive.files) or 'no arrays'}). Fix: {_FIX_KEYS}."
                )
            return {key: archive[key] for key in NPZ_KEYS}
    except RunnerError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise RunnerError(
            f"{where}: not a readable .npz file ({type(error).__name__}: "
            f"{' '.join(str(error).split())}). Fix: {_FIX_KEYS}."
        ) from None


def _check_split(where: str, split: str, inputs: np.ndarray, labels: np.ndarray, task: str) -> None:
    """n > 0 examples of rank 1 or more, and n labels: integer class indices for task=classification."""
    classes = kind_named(task).class_indices
    if (
        inputs.ndim < 2
        or labels.ndim < 1
        or (classes and labels.ndim != 1)
        or len(inputs) != len(labels)
        or not len(labels)
    ):
        raise RunnerError(
            f"{where}: x_{split} is shaped {inputs.shape} and y_{split} {labels.shape}; expected "
            f"(n, ...) inputs and n labels, n > 0. Fix: {_FIX_KEYS}."
        )
    if classes and not np.issubdtype(labels.dtype, np.integer):
        raise RunnerError(
            f"{where}: y_{split} holds {labels.dtype} values, not integer class indices. Fix: store labels as "
            "integers 0..num_classes-1 (y.astype(np.int64)), or pass task=regression for numeric targets."
        )


def _check_example_shapes(where: str, x_train: np.ndarray, x_test: np.ndarray) -> None:
    if x_train.shape[1:] != x_test.shape[1:]:
        raise RunnerError(
            f"{where}: x_train examples are shaped {x_train.shape[1:]} and x_test examples "
            f"{x_test.shape[1:]}. Fix: give both splits examples of one shape."
        )


def _classes(where: str, arrays: dict[str, np.ndarray], num_classes: int | None) -> int:
    """num_classes (null: the largest label + 1), once both splits' labels are class indices below it."""
    classes = num_classes if num_classes is not None else int(max(arrays["y_train"].max(), arrays["y_test"].max())) + 1
    for split in ("train", "test"):
        labels = arrays[f"y_{split}"]
        if labels.min() < 0 or labels.max() >= classes:
            raise RunnerError(
                f"{where}: y_{split} runs from {labels.min()} to {labels.max()}, outside 0..{classes - 1} "
                f"for {classes} classes. Fix: store class indices 0..num_classes-1"
                + (", or set dataset.num_classes to the number of classes" if num_classes else "")
                + "."
            )
    return classes

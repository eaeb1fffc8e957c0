"""A run's data as MLflow dataset inputs describe it, without MLflow: name, digest, source, shapes, context."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def digest(*arrays: np.ndarray) -> str:
    """16 hex digits of sha256 over each array's dtype, shape and bytes."""
    hashed = hashlib.sha256()
    for array in arrays:
        hashed.update(f"{array.dtype.str}{array.shape}".encode())
        hashed.update(np.ascontiguousarray(array).data.cast("B"))
    return hashed.hexdigest()[:16]


def spec(array: np.ndarray) -> dict[str, Any]:
    return {"dtype": array.dtype.name, "shape": list(array.shape), "nbytes": int(array.nbytes)}


def source_of(source: Mapping[str, Any] | None, target: str, seed: int) -> tuple[str, dict[str, Any]]:
    """MLflow's (source_type, source): files by their URI, or the code that made the data (with its seed)."""
    if source is not None and "uri" in source:
        return "local", {"uri": str(source["uri"])}
    return "code", {"tags": {"mlflow.source.name": target, "seed": str(seed), **dict((source or {}).get("tags", {}))}}


def describe_arrays(
    name: str,
    source_type: str,
    source: Mapping[str, Any],
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    validation: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[dict[str, Any]]:
    """The splits held in memory (the validation split's context is `validation`); the digest is sha256 of the
    inputs and labels as loaded, so a different prefix or seed is a different digest."""
    splits = [("train", "training", train), ("test", "evaluation", test)]
    if validation is not None:
        splits.append(("validation", "validation", validation))
    return [
        {
            "name": f"{name}-{split}",
            "context": context,
            "digest": digest(inputs, labels),
            "source_type": source_type,
            "source": dict(source),
            "features": spec(inputs),
            "targets": spec(labels),
        }
        for split, context, (inputs, labels) in splits
    ]


def file_digest(files: Sequence[str], per_file: Sequence[int] = ()) -> str:
    """16 hex digits of sha256 over each file's name, size and modification time (and how much of it is read):
    a file rewritten or replaced is a new digest, without reading the data."""
    hashed = hashlib.sha256()
    for index, file in enumerate(files):
        status = os.stat(file)
        limit = per_file[index] if index < len(per_file) else ""
        hashed.update(f"{os.path.abspath(file)}|{status.st_size}|{status.st_mtime_ns}|{limit}\n".encode())
    return hashed.hexdigest()[:16]


def describe_stream(
    name: str,
    context: str,
    digest_: str,
    source_type: str,
    source: Mapping[str, Any],
    examples: int | None,
    raw_shape: Sequence[int],
    raw_dtype: str,
) -> dict[str, Any]:
    """A split streamed from disk or code, as describe_arrays describes one in memory (-1: an unknown count)."""
    count = -1 if examples is None else int(examples)
    size = int(np.prod(raw_shape)) * np.dtype(raw_dtype).itemsize
    return {
        "name": name,
        "context": context,
        "digest": digest_,
        "source_type": source_type,
        "source": dict(source),
        "features": {
            "dtype": np.dtype(raw_dtype).name,
            "shape": [count, *map(int, raw_shape)],
            "nbytes": count * size if count >= 0 else -1,
        },
        "targets": {"dtype": "int64", "shape": [count], "nbytes": count * 8 if count >= 0 else -1},
    }

"""A run's data as MLflow dataset inputs describe it, without MLflow: name, digest, source, shapes, context."""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

import numpy as np


def digest(*arrays: np.ndarray) -> str:
    """16 hex digits of sha256 over each array's dtype, shape and bytes."""
    hashed = hashlib.sha256()
    for array in arrays:
        hashed.update(f"{array.dtype.str}{array.shape}".encode())
        hashed.update(memoryview(np.ascontiguousarray(array)).cast("B"))
    return hashed.hexdigest()[:16]


def spec(array: np.ndarray) -> dict[str, Any]:
    return {"dtype": array.dtype.name, "shape": list(array.shape), "nbytes": int(array.nbytes)}


def source_of(source: Mapping[str, Any] | None, target: str, seed: int) -> tuple[str, dict[str, Any]]:
    """MLflow's (source_type, source): files by their URI, or the code that made the data (with its seed)."""
    if source is not None and "uri" in source:
        return "local", {"uri": str(source["uri"])}
    return "code", {"tags": {"mlflow.source.name": target, "seed": str(seed), **dict((source or {}).get("tags", {}))}}


def describe_arrays(name: str, source_type: str, source: Mapping[str, Any], train: tuple[np.ndarray, np.ndarray],
                    test: tuple[np.ndarray, np.ndarray]) -> list[dict[str, Any]]:
    """Both splits held in memory; the digest is sha256 of the inputs and labels as loaded, so a different
    prefix or seed is a different digest."""
    return [{"name": f"{name}-{split}", "context": context, "digest": digest(inputs, labels),
             "source_type": source_type, "source": dict(source), "features": spec(inputs), "targets": spec(labels)}
            for split, context, (inputs, labels) in (("train", "training", train), ("test", "evaluation", test))]

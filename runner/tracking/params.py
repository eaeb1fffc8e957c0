"""A run's params: the composed config, flattened to the dotted keys MLflow shows (`optimizer.learning_rate`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay values."""
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat

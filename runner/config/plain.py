"""The composed config as plain Python (what runner.config.settings validates and a run logs as its params)."""

from __future__ import annotations

from typing import Any, cast

from omegaconf import DictConfig, OmegaConf


def as_dict(config: DictConfig) -> dict[str, Any]:
    """OmegaConf.to_container of a DictConfig, resolved: a dict, keyed by the config's names."""
    container = OmegaConf.to_container(config, resolve=True)
    assert isinstance(container, dict)  # a DictConfig's container is a dict
    # OmegaConf types any container's keys as every kind a key may be; a composed config's names are strings.
    return cast(dict[str, Any], container)

"""The composed config as plain Python (what runner.config.settings validates and a run logs as its params)."""

from __future__ import annotations

import copy
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf, open_dict


def as_dict(config: DictConfig) -> dict[str, Any]:
    """OmegaConf.to_container of a DictConfig, resolved: a dict, keyed by the config's names."""
    container = OmegaConf.to_container(config, resolve=True)
    assert isinstance(container, dict)  # a DictConfig's container is a dict
    # OmegaConf types any container's keys as every kind a key may be; a composed config's names are strings.
    return cast(dict[str, Any], container)


def as_plain(node: Any) -> Any:
    """A config node as plain Python (a DictConfig resolved into a dict); anything else as it is."""
    return as_dict(node) if isinstance(node, DictConfig) else node


def job_config(sweep_config: DictConfig) -> DictConfig:
    """A copy of a sweep's config without its `hydra` node: the keys each of its jobs validates (Hydra's sweep
    config holds none of the swept values)."""
    job = copy.deepcopy(sweep_config)
    with open_dict(job):
        job.pop("hydra", None)
    return job

"""`python -m runner --help`: the config groups and their options, the directories of `hydra.searchpath` included
(Hydra's own `$APP_CONFIG_GROUPS` lists only conf/'s). conf/config.yaml's help template reads them through the
`runner_config_groups` resolver."""

from __future__ import annotations

from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType
from omegaconf import OmegaConf

from runner.searchpath import searchpath_overrides

RESOLVER = "runner_config_groups"


def config_groups(_root_: Any) -> str:
    """One line per group a user picks an option of: `group: option, option`."""
    loader = GlobalHydra.instance().config_loader()
    overrides = searchpath_overrides(OmegaConf.select(_root_, "hydra"))
    name = str(OmegaConf.select(_root_, "hydra.job.config_name") or "config")
    groups = sorted(set(loader.get_group_options("", ObjectType.GROUP, name, overrides)) - {"hydra"})
    return "\n".join(
        f"{group}: {', '.join(sorted(loader.get_group_options(group, ObjectType.CONFIG, name, overrides)))}"
        for group in groups
    )


def register_help() -> None:
    """The resolver the help template calls (idempotent)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, config_groups)

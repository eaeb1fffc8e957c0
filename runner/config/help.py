"""`python -m runner --help`: the config groups and their options, the directories of `hydra.searchpath` included
(Hydra's own `$APP_CONFIG_GROUPS` lists only conf/'s). conf/config.yaml's help template reads them through the
`runner_config_groups` resolver."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType
from omegaconf import OmegaConf

from runner.searchpath import searchpath_overrides

RESOLVER = "runner_config_groups"


def group_names(config_name: str, searchpath: Sequence[str]) -> list[str]:
    """The config groups a user picks an option of, in conf/ and in the directories `searchpath` (the command's
    `hydra.searchpath=[...]` overrides) adds."""
    found = _loader().get_group_options("", ObjectType.GROUP, config_name, list(searchpath))
    return sorted(set(found) - {"hydra"})


def group_options(group: str, config_name: str, searchpath: Sequence[str]) -> list[str]:
    """A group's options, in conf/ and in the directories of `searchpath`."""
    return sorted(_loader().get_group_options(group, ObjectType.CONFIG, config_name, list(searchpath)))


def config_groups(_root_: Any) -> str:
    """One line per group a user picks an option of: `group: option, option`."""
    searchpath = searchpath_overrides(OmegaConf.select(_root_, "hydra"))
    name = str(OmegaConf.select(_root_, "hydra.job.config_name") or "config")
    return "\n".join(
        f"{group}: {', '.join(group_options(group, name, searchpath))}" for group in group_names(name, searchpath)
    )


def _loader() -> Any:
    return GlobalHydra.instance().config_loader()


def register_help() -> None:
    """The resolver the help template calls (idempotent)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, config_groups)

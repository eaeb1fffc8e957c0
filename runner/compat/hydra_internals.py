"""The private names of Hydra the runner uses, in one place; tests/test_compat.py fails, naming Hydra's version, when
one of them changes."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from hydra._internal.utils import get_args_parser  # Hydra's own command-line parser (hydra.main uses it)


def parse_command_line(arguments: Sequence[str]) -> argparse.Namespace | None:
    """`python -m runner <arguments>` as Hydra reads it (its options, and the overrides); None for a command line
    Hydra itself refuses with its usage line, or --version."""
    try:
        return get_args_parser().parse_args(list(arguments))
    except SystemExit:
        return None


def rename_stored_config(store: Any, group: str, name: str, new_name: str) -> None:
    """Move a config a plugin stored in Hydra's ConfigStore (`group/name`) to `group/new_name`. The ConfigStore has
    no public way to remove an entry: its `repo` mapping (group -> {name.yaml: ConfigNode}) is changed in place."""
    parent: dict[str, Any] = store.repo
    for part in group.split("/"):
        parent = parent.get(part, {})
    node = parent.pop(f"{name}.yaml", None)
    if node is not None:
        store.store(group=group, name=new_name, node=node.node, provider=node.provider)

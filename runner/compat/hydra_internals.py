"""The private names of Hydra the runner uses, in one place; tests/test_compat.py fails, naming Hydra's version, when
one of them changes."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from hydra._internal.hydra import Hydra  # Hydra's runner of a command line (hydra.main builds one)
from hydra._internal.utils import get_args_parser  # Hydra's own command-line parser (hydra.main uses it)
from hydra.types import RunMode


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


@contextmanager
def mode_from_command_line(arguments: Sequence[str]) -> Iterator[None]:
    """While a command line that names its mode (`hydra.mode=RUN`, as a sweep job's run does) is run, Hydra takes the
    mode from it instead of composing the whole config once only to read `hydra.mode` (Hydra.get_mode, which
    hydra/_internal/utils.py `_run_hydra` calls before the compose that runs): an override wins over the config, so
    the answer is the same, and each of a sweep's runs composes once. Any other command line is run as Hydra runs it."""
    named = [value for key, _, value in (argument.partition("=") for argument in arguments) if key == "hydra.mode"]
    if not named or named[-1] not in RunMode.__members__:
        yield
        return
    mode = RunMode[named[-1]]
    probe = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: mode  # type: ignore[method-assign]  # Hydra has no option for it
    try:
        yield
    finally:
        Hydra.get_mode = probe  # type: ignore[method-assign]  # restored as Hydra wrote it


def job_error(ret: Any) -> Any:
    """What a failed JobReturn holds instead of a value (its `_return_value`: the job's exception); its public
    `return_value` raises it instead."""
    return ret._return_value


def submitit_executor(launcher: Any) -> str:
    """The submitit executor a hydra-submitit-launcher launcher submits to (its class's `_EXECUTOR`: slurm or
    local)."""
    return str(launcher._EXECUTOR)

"""The config directories a command adds with `hydra.searchpath=[...]`, passed on to the processes it starts
(a sweep job's training process, a local cluster's tasks), which compose their config anew: without them
`model=my_mlp` from a user's own config directory would not be found there."""

from __future__ import annotations

import os
from typing import Any

from omegaconf import OmegaConf


def searchpath_overrides(hydra_config: Any) -> list[str]:
    """`hydra.searchpath=[...]` as this process was given it, `file://` paths made absolute (the other
    process may start elsewhere); [] when none was given."""
    paths = [str(path) for path in (OmegaConf.select(hydra_config, "searchpath") or [])]
    if not paths:
        return []
    cwd = str(OmegaConf.select(hydra_config, "runtime.cwd") or os.getcwd())
    absolute = []
    for path in paths:
        if path.startswith("file://"):
            path = "file://" + os.path.normpath(os.path.join(cwd, path[len("file://") :]))
        # Quoted: Hydra's override grammar would read a comma in a path as a sweep and stop at a space.
        absolute.append("'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'")
    return [f"hydra.searchpath=[{','.join(absolute)}]"]

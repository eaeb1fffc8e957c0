"""Tests that need a tool this machine may lack: `@requires("postgresql")`, `@requires("chromium", ...)`.

Without the tool the test is skipped with a reason naming what to install; when CI=true (as CI sets it) the
test fails instead, since CI installs every tool (.ci/run) and a skipped test must not pass it. The check
runs before the test's fixtures start anything (conftest.py's pytest_runtest_setup).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil

import pytest


def _program(name: str) -> bool:
    return shutil.which(name) is not None or os.path.exists(f"/usr/sbin/{name}")


def _postgresql() -> bool:  # Debian keeps the server binaries off PATH (helpers/servers.py: postgres_bin)
    return bool(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or _program("initdb")


# tool -> (is it here?, what to install when it is not)
TOOLS = {
    "postgresql": (_postgresql, "Debian's postgresql package (apt-get install -y --no-install-recommends postgresql)"),
    # The system's python3 -m venv (docs/team-server.md makes the server's environment with it).
    "python3-venv": (
        lambda: bool(glob.glob("/usr/lib/python3*/ensurepip/__init__.py")),
        "Debian's python3-venv package (apt-get install -y --no-install-recommends python3-venv)",
    ),
    "chromium": (
        lambda: _program("chromium"),
        "Debian's chromium package (apt-get install -y --no-install-recommends chromium)",
    ),
    "slurm": (
        lambda: all(_program(name) for name in ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo")),
        "Debian's slurmctld, slurmd and slurm-client packages "
        "(apt-get install -y --no-install-recommends slurmctld slurmd slurm-client)",
    ),
    "iproute2": (
        lambda: _program("ip"),
        "Debian's iproute2 package (apt-get install -y --no-install-recommends iproute2)",
    ),
    "ray": (
        lambda: importlib.util.find_spec("ray") is not None,
        "the optional extra 'ray' (pip install -e '.[ray]', or '.[test]' as README's Set up does)",
    ),
}


def requires(*tools: str) -> pytest.MarkDecorator:
    """Mark a test (or a module, through pytestmark) as needing each of `tools` (keys of TOOLS)."""
    unknown = [tool for tool in tools if tool not in TOOLS]
    if unknown:
        raise ValueError(f"requires({', '.join(map(repr, unknown))}): known tools are {', '.join(TOOLS)}")
    return pytest.mark.requires(*tools)


def missing(tools) -> list[str]:
    """What to install for each of `tools` that this machine lacks."""
    return [f"{tool} is not installed: install {TOOLS[tool][1]}" for tool in tools if not TOOLS[tool][0]()]


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"

"""`python -m runner` in a fresh process, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# What a CPU-only run printed before runner.verbosity: TensorFlow's CUDA probe, oneDNN notice and absl's
# note (C++, while TensorFlow loads), the INFO lines of TensorFlow's, absl's and MLflow's Python loggers, and
# matplotlib's on its first drawing on a machine (an empty font cache).
NOISE = (
    "Could not find cuda drivers",
    "failed call to cuInit",
    "oneDNN custom operations",
    "absl::InitializeLog",
    "Reduce to /job:localhost",
    "Using MirroredStrategy with devices",
    "Sharding callback",
    "[absl][INFO]",
    "[tensorflow][INFO]",
    "INFO mlflow",
    "Creating initial MLflow database tables",
    "generated new fontManager",
    "[matplotlib",
)


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the MLflow variables a developer (or runner.verbosity, in this process)
    may have set, unbuffered."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in (
            "MLFLOW_TRACKING_URI",
            "MLFLOW_TRACKING_USERNAME",
            "MLFLOW_TRACKING_PASSWORD",
            "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT",
        )
    }
    return {**env, "PYTHONUNBUFFERED": "1", **(extra or {})}


def run_cli(
    *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m runner <args>` in a fresh process, as a user runs it (`env`: variables to add)."""
    return subprocess.run(
        [sys.executable, "-m", "runner", *args],
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_cli(*args: str, cwd: Path) -> subprocess.Popen:
    """`python -m runner <args>` started in the background (for tests that signal or kill it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "runner", *args],
        cwd=cwd,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

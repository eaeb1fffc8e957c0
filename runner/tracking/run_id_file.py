"""The run directory's `mlflow_run_id.txt`: the MLflow run that training in that directory continues."""

from __future__ import annotations

import os

RUN_ID_FILE = "mlflow_run_id.txt"


def write_run_id(run_dir: str, run_id: str) -> None:
    with open(os.path.join(run_dir, RUN_ID_FILE), "w") as handle:
        handle.write(run_id + "\n")


def read_run_id(run_dir: str) -> str | None:
    """The id of run_dir's MLflow run; None when no run was created for it (or its file is empty)."""
    try:
        with open(os.path.join(run_dir, RUN_ID_FILE)) as handle:
            return handle.read().strip() or None
    except FileNotFoundError:
        return None

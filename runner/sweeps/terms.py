"""The words a sweep and its runs share: the tag and file names on the parent and child runs, and the objective
each job returns to the sweeper. A leaf: the callback, the sweep job, the summary and a training job all read
it without importing one another."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from runner.errors import RunnerError
from runner.outcome import RESULT_KEYS

PARENT_RUN_ID_FILE = "mlflow_parent_run_id.txt"
# Tags on the parent: the command line's overrides, the keys that vary, the sweep directory.
# Tags on each child: its job number and its own overrides (plus MLflow's mlflow.parentRunId), the launcher
# that ran it (basic, joblib, submitit_slurm, submitit_local, ray), under SLURM the SLURM job id, and on Ray the
# node id (ray_node_id, see runner.sweeps.ray_worker).
OVERRIDES_TAG = "overrides"
SWEPT_KEYS_TAG = "swept_keys"
SWEEP_DIR_TAG = "sweep_dir"
JOB_NUMBER_TAG = "job_number"
# Each child's configuration (its swept values without `seed`) and seed; on the parent, the configuration
# with the best mean objective.
CONFIGURATION_TAG = "configuration"
SEED_TAG = "seed"
SEED_KEY = "seed"
BEST_CONFIGURATION_TAG = "best_configuration"
LAUNCHER_TAG = "launcher"
SLURM_JOB_ID_TAG = "slurm_job_id"
WALL_SECONDS = "wall_seconds"
# On the parent: the registered model version the sweep's best job became (`fashion_mnist/3`).
REGISTERED_VERSION_TAG = "registered_model_version"


def objective_name(config: Any) -> str:
    """The metric a sweep job returns to the sweeper: `sweep.objective`, validated."""
    sweep = config.get("sweep")
    if not isinstance(sweep, Mapping):
        raise RunnerError(
            f"sweep={sweep!r} is not valid: it is a group of settings, not a value. Fix: set its "
            "keys one at a time, e.g. sweep.objective=test_accuracy."
        )
    name = sweep.get("objective")
    if name not in RESULT_KEYS:
        raise RunnerError(
            f"sweep.objective={name!r} is not valid: a sweep job can only return one of its final numbers, "
            f"{', '.join(RESULT_KEYS)}. Fix: pass e.g. sweep.objective=test_accuracy."
        )
    return name


def lower_is_better(objective: str, sweeper_direction: Any = None) -> bool:
    """The sweeper's direction when it has one (optuna), else what the metric's name says."""
    direction = getattr(sweeper_direction, "name", sweeper_direction)
    if isinstance(direction, str) and direction in ("minimize", "maximize"):
        return direction == "minimize"
    return objective.endswith("loss")


def worst_value(objective: str, sweeper_direction: Any = None) -> float:
    """What a failed job returns: a value that can never be the best one (the runner's Optuna sweeper records
    such a trial as FAIL)."""
    return float("inf") if lower_is_better(objective, sweeper_direction) else float("-inf")


def run_name_for(path: str) -> str:
    """A directory as the user sees it: relative to where the command ran, if it lies below it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def read_parent_run_id(sweep_dir: str) -> str | None:
    """The id of the sweep's parent run, once the sweep has created it."""
    path = os.path.join(sweep_dir, PARENT_RUN_ID_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return handle.read().strip() or None

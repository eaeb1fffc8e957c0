"""A sweep's MLflow parent run ended FAILED when the sweep itself stops with an error (its launcher cannot submit
its jobs): Hydra calls the callback's on_multirun_end only after a sweep that returned, so without this the parent
would stay RUNNING in the MLflow UI as if the sweep still ran."""

from __future__ import annotations

import logging
import os
from typing import Any

from runner.config.settings import mlflow_settings
from runner.sweeps.terms import read_parent_run_id

log = logging.getLogger("runner")


def fail_parent_run(config: Any, error: str) -> None:
    """Mark the parent run of the sweep `config` (the sweep's whole config, hydra node included) FAILED with
    `error` as its error tag; nothing if the sweep has no parent run yet. Best effort: the error being reported
    matters more than the run's status, so a store that cannot be reached is only logged."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415  MLflow: only once the sweep failed
    from mlflow.tracking import MlflowClient  # noqa: PLC0415  MLflow: only once the sweep failed

    from runner.tracking.run_writer import end_failed  # noqa: PLC0415  MLflow: only once the sweep failed

    parent_id = read_parent_run_id(os.path.abspath(str(config.hydra.sweep.dir)))
    if parent_id is None:
        return
    try:
        end_failed(MlflowClient(tracking_uri=mlflow_settings(config).tracking_uri or None), parent_id, error)
    except MlflowException as failure:
        log.warning("the sweep's parent run %s could not be marked FAILED: %s", parent_id, failure)

"""A sweep's MLflow parent run ended FAILED when the sweep itself stops with an error (its launcher cannot submit
its jobs): Hydra calls the callback's on_multirun_end only after a sweep that returned, so without this the parent
would stay RUNNING in the MLflow UI as if the sweep still ran."""

from __future__ import annotations

import logging
import os
from typing import Any

from runner.sweeps.terms import read_parent_run_id
from runner.tracking.lifecycle import ERROR_TAG

log = logging.getLogger("runner")


def fail_parent_run(config: Any, error: str) -> None:
    """Mark the parent run of the sweep `config` (the sweep's whole config, hydra node included) FAILED with
    `error` as its error tag; nothing if the sweep has no parent run yet. Best effort: the error being reported
    matters more than the run's status, so a store that cannot be reached is only logged."""
    from mlflow.entities import RunStatus
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    parent_id = read_parent_run_id(os.path.abspath(str(config.hydra.sweep.dir)))
    if parent_id is None:
        return
    try:
        client = MlflowClient(tracking_uri=config.mlflow.tracking_uri or None)
        client.set_tag(parent_id, ERROR_TAG, error[:5000])
        client.set_terminated(parent_id, RunStatus.to_string(RunStatus.FAILED))
    except MlflowException as failure:
        log.warning("the sweep's parent run %s could not be marked FAILED: %s", parent_id, failure)

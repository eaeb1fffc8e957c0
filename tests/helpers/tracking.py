"""Reading what a run recorded in MLflow."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def mlflow_client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def metric_history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    """(step, value) of each logged value of `key`, by step."""
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def load_model(tracking_uri: str, model_uri: str):
    """The MLflow Model at `model_uri` (runs:/..., models:/...) of the store at `tracking_uri`, loaded as a user
    loads it (mlflow.pyfunc; a models:/ URI is looked up in the tracking store), the tracking URI restored after."""
    import mlflow

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)
    try:
        return mlflow.pyfunc.load_model(model_uri)
    finally:
        mlflow.set_tracking_uri(previous)


def only_run(tmp_path):
    """The client of `sqlite:///<tmp_path>/mlflow.db` and the one run it holds (fails unless exactly one)."""
    client = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return client, runs[0]


@contextlib.contextmanager
def as_user(user: str, password: str) -> Iterator[None]:
    """MLflow's client (and its auth client) as `user`: they read the standard variables, restored afterwards."""
    saved = {key: os.environ.get(key) for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    os.environ.update(MLFLOW_TRACKING_USERNAME=user, MLFLOW_TRACKING_PASSWORD=password)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

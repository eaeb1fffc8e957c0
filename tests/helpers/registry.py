"""Model versions registered from several processes at once, as the jobs of a parallel sweep register them."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np

from helpers.tracking import mlflow_client
from runner.tracking.registry import champion_version


def make_runs_with_models(client, count: int) -> list[str]:
    """Runs that each have their model, as a finished run does (the LoggedModel without its files: the
    registry only links to it)."""
    experiment_id = client.create_experiment(f"registry-{time.time_ns()}")
    run_ids = []
    for _ in range(count):
        run_id = client.create_run(experiment_id).info.run_id
        client.create_logged_model(experiment_id, name="model", source_run_id=run_id)
        client.set_terminated(run_id)
        run_ids.append(run_id)
    return run_ids


_REGISTER = """
import sys, time
from mlflow.tracking import MlflowClient
from runner.tracking.registry import register_run_model
uri, name, run_id, value, start = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
client = MlflowClient(uri)
client.search_registered_models(max_results=1)  # the store is open before the start line
time.sleep(max(0.0, start - time.time()))
print(register_run_model(client, name, run_id, "test_accuracy", value, lower_is_better=False).version)
"""


def register_in_parallel(tracking_uri: str, name: str, values: list[float]) -> list[str]:
    """Register one run per value from as many processes, all starting at once; return the run ids."""
    run_ids = make_runs_with_models(mlflow_client(tracking_uri), len(values))
    start = time.time() + 10  # after every process has imported MLflow
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _REGISTER, tracking_uri, name, run_id, str(value), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run_id, value in zip(run_ids, values, strict=True)
    ]
    try:
        for process in processes:
            _, stderr = process.communicate(timeout=180)
            assert process.returncode == 0, stderr[-3000:]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return run_ids


def assert_parallel_registrations_settled(
    tracking_uri: str, name: str, values: list[float], run_ids: list[str]
) -> None:
    client = mlflow_client(tracking_uri)
    versions = client.search_model_versions(f"name = '{name}'")
    assert sorted(int(version.version) for version in versions) == list(range(1, len(values) + 1))
    assert sorted(version.run_id for version in versions) == sorted(run_ids)
    best = run_ids[int(np.argmax(values))]
    assert champion_version(client, name).run_id == best

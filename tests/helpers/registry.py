"""Model versions registered from several processes at once, as the jobs of a parallel sweep register them."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from helpers.tracking import mlflow_client
from helpers.waiting import StartLine
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


# A process that registers a run's model, started with others: the store open, it waits at the start line
# (StartLine.code(), between the two).
_OPEN_THE_STORE = """
import sys
from mlflow.tracking import MlflowClient
from runner.tracking.registry import register_run_model
uri, name, run_id, value = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
client = MlflowClient(uri)
client.search_registered_models(max_results=1)  # the store is open before the start line
"""
_REGISTER = """
print(register_run_model(client, name, run_id, "test_accuracy", value, lower_is_better=False).version)
"""


def register_in_parallel(tracking_uri: str, name: str, values: list[float]) -> list[str]:
    """Register one run per value from as many processes, all starting at once; return the run ids."""
    run_ids = make_runs_with_models(mlflow_client(tracking_uri), len(values))
    start = tempfile.TemporaryDirectory(prefix="start-line-")
    line = StartLine(Path(start.name))
    code = _OPEN_THE_STORE + line.code() + _REGISTER
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", code, tracking_uri, name, run_id, str(value)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run_id, value in zip(run_ids, values, strict=True)
    ]
    try:
        line.go(processes, timeout=180)  # once every process has imported MLflow and opened the store
        for process in processes:
            _, stderr = process.communicate(timeout=180)
            assert process.returncode == 0, stderr[-3000:]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        start.cleanup()
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

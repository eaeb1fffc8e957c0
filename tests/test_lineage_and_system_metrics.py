"""What a run saw and what the machine did meanwhile: the training and evaluation data as MLflow dataset inputs
(told apart by digest, logged once however often a run resumes), and MLflow's system metrics sampled by the
tracker process every configured interval, or not at all when turned off."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time

import pytest

from helpers.concurrent_tracking import log_inputs_at_the_barrier
from helpers.config import dataset_settings, mlflow_settings
from helpers.data import write_fashion_mnist
from helpers.tracking import metric_history, mlflow_client
from runner.data.loading import load_data

SAMPLED = ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes")


def _inputs(client, run_id: str) -> dict[str, tuple[str, str, dict, str]]:
    """context -> (name, digest, source, source_type) of a run's dataset inputs."""
    found = {}
    for item in client.get_run(run_id).inputs.dataset_inputs:
        context = {tag.key: tag.value for tag in item.tags}["mlflow.data.context"]
        assert context not in found, f"{context} logged twice"
        found[context] = (
            item.dataset.name,
            item.dataset.digest,
            json.loads(item.dataset.source),
            item.dataset.source_type,
        )
    return found


def _digests(settings, seed: int = 42) -> dict[str, str]:
    return {d["context"]: d["digest"] for d in load_data(settings, seed).inputs()}


def test_digests_tell_apart_prefixes_seeds_and_sources_and_name_where_the_data_came_from(tmp_path):
    synthetic = dataset_settings("synthetic", train_examples=256, test_examples=64)
    base = _digests(synthetic)
    assert base == _digests(synthetic)  # same data, same digest
    shorter = _digests(dataset_settings("synthetic", train_examples=128, test_examples=64))
    assert shorter["training"] != base["training"]
    reseeded = _digests(synthetic, seed=7)
    assert reseeded["training"] != base["training"] and reseeded["evaluation"] != base["evaluation"]

    write_fashion_mnist(tmp_path, train=30, test=10)
    idx = load_data(dataset_settings("fashion_mnist", dir=tmp_path), seed=42).inputs()
    assert [(d["name"], d["context"], d["source_type"], d["source"]) for d in idx] == [
        ("fashion_mnist-train", "training", "local", {"uri": str(tmp_path)}),
        ("fashion_mnist-test", "evaluation", "local", {"uri": str(tmp_path)}),
    ]
    assert idx[0]["features"] == {"dtype": "uint8", "shape": [30, 28, 28], "nbytes": 30 * 28 * 28}
    prefix = _digests(dataset_settings("fashion_mnist", dir=tmp_path, train_examples=20, test_examples=None))
    assert prefix["training"] != idx[0]["digest"] and prefix["evaluation"] == idx[1]["digest"]


def test_a_run_records_its_data_once_even_when_resumed(train, tmp_path, tracking_uri):
    result = train("dataset.train_examples=256", "seed=3", run_dir=tmp_path / "run")
    client = mlflow_client(tracking_uri)
    inputs = _inputs(client, result.run_id)
    assert set(inputs) == {"training", "evaluation"}
    name, digest, source, source_type = inputs["training"]
    assert (name, source, source_type) == (
        "synthetic-train",
        {"tags": {"mlflow.source.name": "synthetic", "seed": "3"}},
        "code",
    )
    assert digest == _digests(dataset_settings("synthetic", train_examples=256, test_examples=256), seed=3)["training"]
    shapes = {
        json.loads(item.dataset.profile)["features_shape"][0]
        for item in client.get_run(result.run_id).inputs.dataset_inputs
    }
    assert shapes == {256}  # the training prefix and TINY's 256 test examples
    assert all(
        "mlflow_tensorspec" in json.loads(item.dataset.schema)
        for item in client.get_run(result.run_id).inputs.dataset_inputs
    )

    again = train("dataset.train_examples=256", "seed=3", run_dir=tmp_path / "run")  # resumes the finished run
    assert again.run_id == result.run_id
    assert _inputs(client, result.run_id) == inputs  # _inputs fails on a context logged twice


PROCESSES, ROUNDS = 6, 8


@pytest.mark.slow
def test_runs_logging_the_same_data_at_once_all_record_it(tmp_path):
    """Six processes log the same two datasets at the same moment into one store: MLflow's store would let only
    one insert each dataset and fail the others (UNIQUE constraint failed, a sweep job FAILED for it)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow_client(uri).create_experiment("tests")  # the store and experiment exist, as in a sweep
    # A few rounds, each with datasets new to the store: the processes collide in some round.
    rounds = [
        load_data(dataset_settings("synthetic", train_examples=256, test_examples=64), seed).inputs()
        for seed in range(ROUNDS)
    ]
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(PROCESSES), context.Queue()
    processes = [
        context.Process(
            target=log_inputs_at_the_barrier,
            daemon=True,
            args=(uri, str(tmp_path / f"run{index}"), rounds, barrier, results),
        )
        for index in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    run_ids = [results.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert all(len(run_id) == 32 for run_id in run_ids), run_ids
    client = mlflow_client(uri)
    expected = sorted((d["name"], d["digest"]) for descriptions in rounds for d in descriptions)
    for run_id in run_ids:
        inputs = client.get_run(run_id).inputs.dataset_inputs
        assert sorted((item.dataset.name, item.dataset.digest) for item in inputs) == expected


@pytest.fixture
def tracked(tmp_path):
    """A run held by a TrackerProcess with the given system-metrics settings: (run id, its client)."""
    from runner.tracking.tracker_process import TrackerProcess

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    processes = []

    def _track(metrics: str, seconds: float) -> str:
        """`metrics`: the mlflow.system_metrics overrides, e.g. 'enabled=true interval_seconds=0.25'."""
        process = TrackerProcess(mlflow_settings(uri, *(f"mlflow.system_metrics.{item}" for item in metrics.split())))
        processes.append(process)
        run_dir = tmp_path / f"run{len(processes)}"
        run_dir.mkdir()
        run_id = process.start(str(run_dir), {"batch": 64})
        # Busy, as a training process is: on an idle machine a short window of system-wide CPU can read 0.
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            pass
        # Not in this (the training) process: the sampling thread lives in the tracker's child.
        assert "SystemMetricsMonitor" not in {thread.name for thread in threading.enumerate()}
        process.finish()
        process.close()  # records are handed over without waiting: delivered once the tracker has ended
        return run_id

    yield _track, mlflow_client(uri)
    for process in processes:
        process.close()


def test_the_tracker_process_samples_cpu_and_memory_every_interval(tracked):
    track, client = tracked
    run_id = track("enabled=true interval_seconds=0.25", seconds=2.5)
    for key in SAMPLED:
        history = metric_history(client, run_id, key)
        assert len(history) >= 4, (key, history)
        assert [step for step, _ in history] == list(range(len(history)))
    cpu = [value for _, value in metric_history(client, run_id, SAMPLED[0])]
    # The first CPU sample measures a window of its own, not the instant since the thread's first psutil call.
    assert cpu[0] > 0 and all(0 <= value <= 100 for value in cpu), cpu
    assert all(value > 0 for _, value in metric_history(client, run_id, SAMPLED[1]))
    assert client.get_run(run_id).info.status == "FINISHED"


def test_system_metrics_turned_off_log_nothing(tracked):
    track, client = tracked
    run_id = track("enabled=false interval_seconds=0.25", seconds=1.5)
    assert not [key for key in client.get_run(run_id).data.metrics if key.startswith("system/")]

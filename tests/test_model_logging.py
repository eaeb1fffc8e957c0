"""Every finished run logs its model: one real `python -m runner` run on small IDX files (raw 0-255 pixels),
its model loaded in fresh processes without TF_USE_LEGACY_KERAS (one of them imports Keras 3 first) and served
by the documented `mlflow models serve` command (docs/tracking-and-models.md) over HTTP without it, and the runs
that must keep exactly one model (re-run) or none (stopped while logging it)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import mlflow
import numpy as np
import pytest
import yaml

from helpers.cli import run_cli, start_cli
from helpers.data import write_fashion_mnist
from helpers.serving import post_invocations, serving
from helpers.tracking import mlflow_client

pytestmark = pytest.mark.slow

TEST_IMAGES = 200
RUN = ["strategy=one_device", "dataset=fashion_mnist", "epochs=1", "progress=false", "mlflow.register=true"]


def _store(directory: Path) -> str:
    return f"sqlite:///{directory / 'mlflow.db'}"


def _run_models(client, run_id: str):
    experiment_id = client.get_run(run_id).info.experiment_id
    return [model for model in client.search_logged_models([experiment_id]) if model.source_run_id == run_id]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("logged-model")


@pytest.fixture(scope="module")
def idx(workdir) -> dict:
    """Fashion-MNIST-shaped IDX files: uint8 pixels 0-255, as the real files hold them."""
    (workdir / "idx").mkdir()
    return write_fashion_mnist(workdir / "idx", train=256, test=TEST_IMAGES)


@pytest.fixture(scope="module")
def finished_run(workdir, idx) -> str:
    """One real run of the runner, registering its model; its run id."""
    done = run_cli(
        *RUN,
        f"dataset.dir={workdir / 'idx'}",
        f"mlflow.tracking_uri={_store(workdir)}",
        f"hydra.run.dir={workdir / 'run'}",
        cwd=workdir,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return (workdir / "run" / "mlflow_run_id.txt").read_text().strip()


@pytest.fixture(scope="module")
def served(workdir, finished_run):
    """The run's model served by the documented command in a shell whose environment lacks TF_USE_LEGACY_KERAS
    (and the command does not set it), from the directory holding mlflow.db as the page says; its base URL."""
    with serving(f"runs:/{finished_run}/model", workdir) as url:
        yield url


def test_a_finished_run_has_one_model_with_signature_requirements_and_final_metrics(workdir, finished_run):
    client = mlflow_client(_store(workdir))
    run = client.get_run(finished_run)
    assert run.info.status == "FINISHED"
    [model] = _run_models(client, finished_run)
    assert model.name == "model" and model.experiment_id == run.info.experiment_id
    assert [output.model_id for output in run.outputs.model_outputs] == [model.model_id]
    # The run's final metrics (epoch 1 of 1, and eval_accuracy) are the model's.
    linked = {metric.key: metric.value for metric in model.metrics}
    for key in ("train_loss", "test_accuracy", "eval_accuracy"):
        assert linked[key] == run.data.metrics[key], key
    assert {metric.step for metric in model.metrics} == {1}
    assert run.data.metrics["model_log_seconds"] > 0

    local = Path(mlflow.artifacts.download_artifacts(model.artifact_location, dst_path=str(workdir / "download")))
    mlmodel = yaml.safe_load((local / "MLmodel").read_text())
    assert set(mlmodel["flavors"]) == {"tensorflow", "python_function"}
    assert mlmodel["flavors"]["python_function"]["loader_module"] == "mlflow.tensorflow"
    # A SavedModel of a tf.Module, which tf.saved_model.load reads without Keras; TensorFlow Serving's signature.
    assert mlmodel["flavors"]["tensorflow"]["model_type"] == "tf2-module"
    saved_model = local / mlmodel["flavors"]["tensorflow"]["saved_model_dir"]
    import tensorflow as tf

    serving = tf.saved_model.load(str(saved_model)).signatures["serving_default"]
    assert serving.structured_input_signature[1]["images"].dtype == tf.uint8
    assert set(serving.structured_outputs) == {"probabilities"}
    assert json.loads(mlmodel["signature"]["inputs"]) == [
        {"type": "tensor", "tensor-spec": {"dtype": "uint8", "shape": [-1, 28, 28]}}
    ]
    assert json.loads(mlmodel["signature"]["outputs"]) == [
        {"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1, 10]}}
    ]
    # What the model costs (runner.training.cost): the parameters of the network it serves, the size of the logged
    # model's files, and its served speed as one measurement, linked to the model with the epoch's metrics.
    costs = run.data.metrics
    network = tf.saved_model.load(str(saved_model)).network
    assert costs["parameters"] == costs["trainable_parameters"] == sum(np.prod(v.shape) for v in network.variables)
    assert costs["model_bytes"] == sum(path.stat().st_size for path in local.rglob("*") if path.is_file())
    assert costs["latency_ms"] * costs["served_examples_per_second"] == pytest.approx(1000)
    assert 0 < costs["training_seconds"] < (run.info.end_time - run.info.start_time) / 1000
    assert {"parameters", "latency_ms", "training_seconds"} <= set(linked)
    requirements = (local / "requirements.txt").read_text().split()
    assert f"tensorflow=={version('tensorflow')}" in requirements
    assert not [line for line in requirements if line.startswith("tf-keras")]  # loading it needs no Keras
    example = np.array(json.loads((local / "input_example.json").read_text()))
    assert example.shape[1:] == (28, 28) and example.max() > 1  # raw pixels, not scaled ones


# The documented Python (docs/tracking-and-models.md), as a new user runs it: no TF_USE_LEGACY_KERAS anywhere (the
# test's environment drops it).
_PREDICT = """
import json, os, sys
import numpy as np
assert "TF_USE_LEGACY_KERAS" not in os.environ
if sys.argv[3] == "keras-first":
    import keras  # Keras 3, imported before MLflow and TensorFlow load the model
    assert keras.__version__.startswith("3."), keras.__version__
import mlflow
model = mlflow.pyfunc.load_model(sys.argv[1])
images = np.load(sys.argv[2])
print(json.dumps(np.asarray(model.predict(images)).tolist()))
"""


def _predict_in_fresh_process(workdir: Path, model_uri: str, images: np.ndarray, variant: str) -> np.ndarray:
    """Predictions of `mlflow.pyfunc.load_model(model_uri)` in a fresh Python whose environment has neither
    TF_USE_LEGACY_KERAS nor this repository on its path."""
    np.save(workdir / "images.npy", images)
    env = {key: value for key, value in os.environ.items() if key not in ("TF_USE_LEGACY_KERAS", "PYTHONPATH")}
    env["MLFLOW_TRACKING_URI"] = _store(workdir)
    done = subprocess.run(
        [sys.executable, "-c", _PREDICT, model_uri, str(workdir / "images.npy"), variant],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return np.array(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("variant", ["plain", "keras-first"])
def test_a_fresh_python_without_the_variable_loads_the_model_at_the_runs_eval_accuracy(
    workdir, idx, finished_run, variant
):
    images, labels = idx["test_images"].astype(np.uint8), idx["test_labels"]
    assert images.dtype == np.uint8 and images.max() > 1  # raw pixels
    probabilities = _predict_in_fresh_process(workdir, f"runs:/{finished_run}/model", images, variant)
    assert probabilities.shape == (TEST_IMAGES, 10)
    eval_accuracy = mlflow_client(_store(workdir)).get_run(finished_run).data.metrics["eval_accuracy"]
    correct = int(np.sum(probabilities.argmax(axis=1) == labels))
    assert np.float32(correct / TEST_IMAGES) == np.float32(eval_accuracy)


@pytest.mark.server  # `mlflow models serve`
def test_served_accuracy_equals_eval_accuracy_and_a_fresh_process_loads_the_same_model(
    workdir, idx, finished_run, served
):
    images, labels = idx["test_images"].astype(np.uint8), idx["test_labels"]
    status, answer = post_invocations(served, {"inputs": images.tolist()})
    assert status == 200, answer
    probabilities = np.array(answer["predictions"])
    assert probabilities.shape == (TEST_IMAGES, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    eval_accuracy = mlflow_client(_store(workdir)).get_run(finished_run).data.metrics["eval_accuracy"]
    # eval_accuracy is a float32 Keras metric: compare the counts of correct answers it and the server stand for.
    correct = int(np.sum(probabilities.argmax(axis=1) == labels))
    assert correct == round(eval_accuracy * TEST_IMAGES)
    assert np.float32(correct / TEST_IMAGES) == np.float32(eval_accuracy)

    loaded = _predict_in_fresh_process(workdir, f"runs:/{finished_run}/model", images, "plain")
    np.testing.assert_allclose(loaded, probabilities, rtol=1e-5, atol=1e-7)

    # What the model refuses: another shape, pixels that are not 0-255 integers.
    assert post_invocations(served, {"inputs": images[:, :27].tolist()})[0] == 400
    assert post_invocations(served, {"inputs": (images[:2] * 1.5).tolist()})[0] == 400


def test_the_registered_run_is_the_champion_and_loads_from_the_registry(workdir, finished_run):
    client = mlflow_client(_store(workdir))
    [registered] = client.search_model_versions("name = 'fashion_mnist'")
    assert registered.run_id == finished_run
    assert client.get_model_version_by_alias("fashion_mnist", "champion").version == registered.version
    assert registered.tags["objective"] == "test_accuracy"
    assert float(registered.tags["objective_value"]) == client.get_run(finished_run).data.metrics["test_accuracy"]


def test_rerunning_a_finished_run_logs_no_second_model_and_registers_no_second_version(workdir, finished_run):
    client = mlflow_client(_store(workdir))
    [before] = _run_models(client, finished_run)
    done = run_cli(
        *RUN,
        f"dataset.dir={workdir / 'idx'}",
        f"mlflow.tracking_uri={_store(workdir)}",
        f"hydra.run.dir={workdir / 'run'}",
        cwd=workdir,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "already has its model" in done.stdout + done.stderr
    assert client.get_run(finished_run).info.status == "FINISHED"
    assert [model.model_id for model in _run_models(client, finished_run)] == [before.model_id]
    assert len(client.search_model_versions("name = 'fashion_mnist'")) == 1


def test_a_run_stopped_while_logging_its_model_keeps_none_and_its_resume_logs_one(tmp_path):
    """SIGTERM after the last epoch: the run ends KILLED without a model; the re-run finishes with one."""
    args = [
        "strategy=one_device",
        "dataset=synthetic",
        "dataset.train_examples=256",
        "dataset.test_examples=64",
        "epochs=1",
        "progress=false",
        f"mlflow.tracking_uri={_store(tmp_path)}",
        f"hydra.run.dir={tmp_path / 'run'}",
        "hydra.job_logging.handlers.console.stream=ext://sys.stderr",
    ]
    process = start_cli(*args, cwd=tmp_path)
    try:
        for line in process.stderr:  # the log line right before the model is logged
            if re.search(r"restored .* without a strategy: eval_accuracy", line):
                process.send_signal(signal.SIGTERM)
                break
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    client = mlflow_client(_store(tmp_path))
    run_id = (tmp_path / "run" / "mlflow_run_id.txt").read_text().strip()
    assert client.get_run(run_id).info.status == "KILLED"
    assert _run_models(client, run_id) == []

    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert len(_run_models(client, run_id)) == 1

"""Keras 3 models (`import keras`) in the runner, in real processes: a user's own module trains under two mirrored
CPU replicas, resumes into the same MLflow run, and its logged model predicts raw inputs at eval_accuracy in a fresh
Python that never sets TF_USE_LEGACY_KERAS; the strategies Keras 3 does not support refuse it before any run; the
built-in CNN under runtime.keras=3 trains 2 x 32 as 1 x 64 does. In this process: loss scaling in Keras 3's
terms, and an optimizer of the other Keras refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import run_cli, start_cli
from helpers.data import write_fashion_mnist
from helpers.presets import TINY, WITH_MODEL
from helpers.tracking import metric_history, mlflow_client
from helpers.waiting import wait_for

TEST_IMAGES = 200

# A user's module, as docs/your-own-experiment.md shows it: Keras 3, nothing of the runner's.
KERAS3_MODULE = """
import keras


def mlp(input_shape, num_classes, weight_decay=0.0, hidden=32):
    regularizer = keras.regularizers.L2(weight_decay) if weight_decay else None
    inputs = keras.Input(shape=tuple(input_shape))
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(hidden, activation="relu", kernel_regularizer=regularizer)(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, kernel_regularizer=regularizer)(x))
"""


def _store(directory: Path) -> str:
    return f"sqlite:///{directory / 'mlflow.db'}"


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    """A working directory holding the user's Keras 3 module (importable from it) and Fashion-MNIST-shaped IDX
    files of raw uint8 pixels (their arrays in test_images.npy and test_labels.npy)."""
    directory = tmp_path_factory.mktemp("keras3")
    (directory / "k3lab.py").write_text(KERAS3_MODULE)
    (directory / "idx").mkdir()
    arrays = write_fashion_mnist(directory / "idx", train=3072, test=TEST_IMAGES)
    np.save(directory / "test_images.npy", arrays["test_images"].astype(np.uint8))
    np.save(directory / "test_labels.npy", arrays["test_labels"])
    return directory


def _mirrored_run(lab: Path) -> list[str]:
    """The user's Keras 3 model under two mirrored CPU replicas: three epochs of 48 steps, a checkpoint after each."""
    return [
        "strategy=mirrored",
        "strategy.cpu_replicas=2",
        "dataset=fashion_mnist",
        f"dataset.dir={lab / 'idx'}",
        "model._target_=k3lab.mlp",
        "epochs=3",
        "checkpoint.every_epochs=1",
        "progress=false",
        WITH_MODEL,
        f"mlflow.tracking_uri={_store(lab)}",
        f"hydra.run.dir={lab / 'run'}",
    ]


@pytest.fixture(scope="module")
def resumed_run(lab) -> str:
    """The user's Keras 3 model killed (kill -9) after its first checkpoint, then resumed by the same command
    into the same run, which logs its model and registers it; the run id."""
    process = start_cli(*_mirrored_run(lab), "mlflow.register=true", cwd=lab)
    try:
        wait_for(lambda: list((lab / "run" / "checkpoints").glob("ckpt-*.index")), what="the first checkpoint")
    finally:
        process.kill()
        process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    done = run_cli(*_mirrored_run(lab), "mlflow.register=true", cwd=lab)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming after epoch 1" in done.stdout, done.stdout[-3000:]
    return (lab / "run" / "mlflow_run_id.txt").read_text().strip()


# The documented Python (docs/tracking-and-models.md), in an environment without TF_USE_LEGACY_KERAS.
_PREDICT = """
import json, os, sys
import numpy as np
assert "TF_USE_LEGACY_KERAS" not in os.environ
import mlflow
model = mlflow.pyfunc.load_model(sys.argv[1])
print(json.dumps(np.asarray(model.predict(np.load(sys.argv[2]))).tolist()))
"""


@pytest.mark.slow
def test_a_users_keras3_model_trains_on_two_mirrored_replicas_resumes_and_predicts_at_eval_accuracy(lab, resumed_run):
    client = mlflow_client(_store(lab))
    run = client.get_run(resumed_run)
    assert run.info.status == "FINISHED"
    assert (run.data.params["num_replicas"], run.data.params["model._target_"]) == ("2", "k3lab.mlp")
    losses = metric_history(client, resumed_run, "train_loss")
    assert [step for step, _ in losses] == [1, 2, 3]  # each epoch once, across the two invocations
    assert all(np.isfinite(loss) for _, loss in losses)
    eval_accuracy = run.data.metrics["eval_accuracy"]
    labels = np.load(lab / "test_labels.npy")
    env = {key: value for key, value in os.environ.items() if key not in ("TF_USE_LEGACY_KERAS", "PYTHONPATH")}
    env["MLFLOW_TRACKING_URI"] = _store(lab)
    # Registered by the run (mlflow.register=true): its version serves what the run logged.
    [version] = client.search_model_versions("name='fashion_mnist'")
    assert version.run_id == resumed_run
    assert client.get_model_version_by_alias("fashion_mnist", "champion").version == version.version
    done = subprocess.run(
        [sys.executable, "-c", _PREDICT, f"models:/fashion_mnist/{version.version}", str(lab / "test_images.npy")],
        cwd=lab,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    probabilities = np.array(json.loads(done.stdout.strip().splitlines()[-1]))
    assert probabilities.shape == (TEST_IMAGES, 10)
    correct = int(np.sum(probabilities.argmax(axis=1) == labels))
    assert np.float32(correct / TEST_IMAGES) == np.float32(eval_accuracy)

    # A fresh run warm-started from the registered version begins where the trained model is: its first epoch's
    # loss is below the original run's first epoch's.
    warm = run_cli(
        *_mirrored_run(lab),
        f"init.from=models:/fashion_mnist/{version.version}",
        "epochs=1",
        "mlflow.log_model=false",
        f"hydra.run.dir={lab / 'warm'}",
        cwd=lab,
    )
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert f"initialised the model from models:/fashion_mnist/{version.version}" in warm.stdout + warm.stderr
    warm_id = (lab / "warm" / "mlflow_run_id.txt").read_text().strip()
    [(_, warm_loss)] = metric_history(client, warm_id, "train_loss")
    assert warm_loss < losses[0][1], (warm_loss, losses)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "issue", "extra"),
    [
        ("multi_worker_mirrored", "keras #20585", ["cluster=local"]),
        ("parameter_server", "keras #18624", ["cluster=local", "loop.steps_per_epoch=4"]),
    ],
)
def test_a_users_keras3_model_is_refused_where_keras3_does_not_train_it(lab, tmp_path, strategy, issue, extra):
    done = run_cli(
        *TINY,
        f"strategy={strategy}",
        *extra,
        "model._target_=k3lab.mlp",
        f"mlflow.tracking_uri={_store(tmp_path)}",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=lab,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    message = done.stderr
    assert f"model._target_='k3lab.mlp' built a Keras 3 model, and strategy={strategy} cannot train it" in message
    assert issue in message and "`import tf_keras as keras`" in message and "mirrored" in message
    assert "Traceback" not in message, message[-3000:]
    # The chief's paragraph comes first. (Under parameter_server the local cluster's launcher then also names a
    # server that stopped because the chief failed: its own defect, for any refusal the chief makes while building.)
    assert message.startswith("error: model._target_="), message[-3000:]
    client = mlflow_client(_store(tmp_path))
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []


@pytest.mark.slow
def test_the_builtin_cnn_under_keras3_trains_two_replicas_of_32_as_one_of_64(tmp_path):
    """Replica invariance: the loss is averaged over the global batch, so epoch 1's train_loss of 2 x 32 equals
    that of 1 x 64 (relative difference below 1e-3). The two runs start together (each mostly loads)."""
    runs = {}
    for replicas, batch in ((1, 64), (2, 32)):
        where = tmp_path / f"replicas-{replicas}"
        overrides = [*TINY, "runtime.keras=3", "strategy=mirrored", f"strategy.cpu_replicas={replicas}"]
        runs[replicas] = (
            where,
            start_cli(
                *overrides,
                f"batch={batch}",
                f"mlflow.tracking_uri={_store(where)}",
                f"hydra.run.dir={where / 'run'}",
                cwd=tmp_path,
            ),
        )
    try:
        outputs = {replicas: process.communicate(timeout=300)[1] for replicas, (_, process) in runs.items()}
    finally:
        for _, process in runs.values():
            if process.poll() is None:
                process.kill()
                process.communicate()
    losses = {}
    for replicas, (where, process) in runs.items():
        assert process.returncode == 0, outputs[replicas][-3000:]
        run_id = (where / "run" / "mlflow_run_id.txt").read_text().strip()
        [(step, loss)] = metric_history(mlflow_client(_store(where)), run_id, "train_loss")
        losses[replicas] = loss
    assert abs(losses[2] - losses[1]) / losses[1] < 1e-3, losses


def _keras3_task(tmp_path: Path, monkeypatch, optimizer: str):
    """The task of the user's Keras 3 module with `optimizer` (an optimizer option's name or `_target_`)."""
    from omegaconf import OmegaConf

    from helpers.config import compose
    from runner.config.settings import checked_targets, validate
    from runner.data.source import DataSpec
    from runner.training.task import Experiment

    (tmp_path / "k3lab.py").write_text(KERAS3_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = compose(["dataset=synthetic", "model._target_=k3lab.mlp", optimizer])
    settings = validate(OmegaConf.to_container(config, resolve=True))
    checked_targets(settings)
    return Experiment.from_settings(settings, DataSpec("digits", (8, 8, 1), 10, (8, 8), "uint8", 16.0))


@pytest.fixture
def keras_lane_restored():
    """The process's Keras lane (runner.builtins.keras_lane) back to tf_keras after a test that selects Keras 3."""
    from runner.builtins import keras_lane

    yield keras_lane
    keras_lane.select(2)


def test_a_keras3_models_loss_scaling_scales_with_scale_loss_and_its_optimizer_unscales(
    tmp_path, monkeypatch, keras_lane_restored
):
    """tf_keras's get_scaled_loss does not exist in Keras 3 (keras #19479): the step scales with scale_loss, and
    Keras 3's LossScaleOptimizer unscales in apply_gradients; the step trains."""
    import tensorflow as tf

    from runner.training.optimizer import LossScaling, prepare_optimizer
    from runner.training.steps import ReplicaSteps, TrainingState

    task = _keras3_task(tmp_path, monkeypatch, "optimizer=sgd")
    state = TrainingState.create(
        task.build_model, lambda variables: prepare_optimizer(task.build_optimizer(0.1), variables, loss_scaling=True)
    )
    scaling = LossScaling.of(state.optimizer)
    assert scaling is not None and scaling.keras3
    loss = tf.constant(2.0)
    scale = float(np.asarray(state.optimizer.dynamic_scale))
    assert scale > 1 and float(scaling.scaled_loss(loss)) == 2.0 * scale
    steps = ReplicaSteps(tf.distribute.get_strategy(), state, 8, task.per_example_loss)
    before = [variable.numpy().copy() for variable in state.model.trainable_variables]
    images = tf.random.stateless_uniform((8, 8, 8, 1), seed=(1, 2))
    labels = tf.range(8) % 10
    float(steps.train_replica_step((images, labels)))
    assert int(state.optimizer.iterations.numpy()) == 1
    after = [variable.numpy() for variable in state.model.trainable_variables]
    # SGD with rate 0.1 moves the weights by 0.1 x the *unscaled* gradient: far less than the scale.
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(after, before, strict=True))
    assert 0 < moved < 1.0


def test_an_optimizer_of_the_other_keras_than_the_models_is_one_paragraph(tmp_path, monkeypatch, keras_lane_restored):
    from runner.errors import RunnerError

    (tmp_path / "k2opt.py").write_text(
        "import tf_keras\n\ndef adam(learning_rate, **arguments):\n"
        "    return tf_keras.optimizers.Adam(learning_rate, **arguments)\n"
    )
    task = _keras3_task(tmp_path, monkeypatch, "optimizer._target_=k2opt.adam")
    task.build_model()
    with pytest.raises(RunnerError) as raised:
        task.build_optimizer(0.001)
    message = str(raised.value)
    assert message.startswith("optimizer._target_='k2opt.adam' returned tf_keras.")
    assert "not an optimizer of the model's Keras (Keras 3)" in message and "Fix:" in message and "\n" not in message


def test_a_keras3_network_in_the_logged_savedmodel_warm_starts_a_fresh_keras3_model(
    tmp_path, monkeypatch, keras_lane_restored
):
    """init.from=runs:/... of a Keras 3 run reads the network's variables from the logged SavedModel: Keras 3
    variables are not tf.Variables, and are still found by their object path under `network`."""
    import tensorflow as tf

    from runner.tracking.model_export import served_module
    from runner.training.warm_start import _restore_network

    task = _keras3_task(tmp_path, monkeypatch, "optimizer=adam")
    trained = task.build_model()
    for variable in trained.weights:
        variable.assign(tf.random.stateless_normal(variable.shape, seed=(3, 4)))
    module = served_module(trained, task.export_model(trained))
    tf.saved_model.save(module, str(tmp_path / "saved"))
    fresh = task.build_model()
    assert not np.array_equal(fresh.weights[0].numpy(), trained.weights[0].numpy())
    _restore_network("init.from='runs:/x/model'", str(tmp_path / "saved" / "variables" / "variables"), fresh)
    for ours, theirs in zip(fresh.weights, trained.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_the_keras_lanes_step_benchmark_times_each_part_in_both_lanes():
    """`python -m bench.keras3_step` at its smallest: every part of the step timed in tf_keras and Keras 3, and the
    process's lane left at tf_keras."""
    from bench.keras3_step import PARTS, markdown_table, measure
    from runner.builtins import keras_lane

    rows = measure(calls=1, repeats=1)
    assert [part for part, _, _ in rows] == list(PARTS)
    assert all(ours > 0 and theirs > 0 for _, ours, theirs in rows)
    assert keras_lane.selected() == 2
    assert markdown_table(rows).count("\n") == len(PARTS) + 2

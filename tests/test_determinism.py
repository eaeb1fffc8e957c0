"""runtime.deterministic=true: the same command twice gives bit-identical numbers, and so does a run
killed with kill -9 and resumed. Floats are compared with ==, never with a tolerance.

Every run is `python -m runner` in a fresh process against a real MLflow store.
"""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import run_cli, start_cli
from helpers.presets import TINY
from helpers.tracking import metric_history, mlflow_client
from helpers.waiting import wait_for

pytestmark = pytest.mark.slow

# Epochs of a second or less; the first checkpoint after epoch 2.
RUN = [
    *TINY,
    "dataset.train_examples=1024",
    "epochs=3",
    "checkpoint.every_epochs=2",
    "seed=5",
    "runtime.deterministic=true",
]
# examples_per_second measures the machine, not the training: the one per-epoch metric that may differ.
REPRODUCIBLE = ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "learning_rate")


def _args(tmp_path: Path, name: str, *extra: str) -> list[str]:
    return [*RUN, f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", f"hydra.run.dir={tmp_path / name}", *extra]


def _outcome(tmp_path: Path, name: str) -> dict:
    """Every reproducible metric of the run (per epoch, and eval_accuracy) and its final weights."""
    import tensorflow as tf

    client = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = (tmp_path / name / "mlflow_run_id.txt").read_text().strip()
    assert client.get_run(run_id).info.status == "FINISHED"
    metrics = {key: metric_history(client, run_id, key) for key in (*REPRODUCIBLE, "eval_accuracy")}
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / name / "checkpoints")))
    weights = {
        key: reader.get_tensor(key)
        for key in reader.get_variable_to_shape_map()
        if key != "_CHECKPOINTABLE_OBJECT_GRAPH"
    }
    return {"metrics": metrics, "weights": weights}


def _train(tmp_path: Path, name: str, *extra: str) -> dict:
    done = run_cli(*_args(tmp_path, name, *extra), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return _outcome(tmp_path, name)


def _assert_identical(first: dict, second: dict, epochs: int = 3) -> None:
    for key, points in first["metrics"].items():
        assert points == second["metrics"][key], key  # exact: tuples of (epoch, float)
        assert len(points) == (1 if key == "eval_accuracy" else epochs), (key, points)
    assert first["weights"].keys() == second["weights"].keys()
    assert len(first["weights"]) > 10  # the model's kernels and biases, Adam's moments, the counters
    for key, value in first["weights"].items():
        assert np.array_equal(value, second["weights"][key]), key


# A loss in a module of the run's directory (`python -m runner` puts its working directory on sys.path) that
# notes, each time the training traces it, whether TensorFlow's op determinism is on in that process.
OP_DETERMINISM_PROBE = """
from tensorflow.python.framework import config

from runner.builtins.losses import sparse_categorical_crossentropy


def loss_noting_op_determinism(labels, logits):
    with open({notes!r}, "a") as notes:
        notes.write(f"{{config.is_op_determinism_enabled()}}\\n")
    return sparse_categorical_crossentropy(labels, logits)
"""


@pytest.mark.parametrize("deterministic", [True, False])
def test_runtime_deterministic_turns_on_op_determinism_in_the_training_process(tmp_path, deterministic):
    """Runs on this CPU are bit-identical even without op determinism: what the flag changes is that
    TensorFlow's op determinism is on while the model trains (and off without it)."""
    notes = tmp_path / "op_determinism.txt"
    (tmp_path / "determinism_probe.py").write_text(OP_DETERMINISM_PROBE.format(notes=str(notes)))
    done = run_cli(
        *TINY,
        "strategy=one_device",
        f"runtime.deterministic={str(deterministic).lower()}",
        "loss._target_=determinism_probe.loss_noting_op_determinism",
        f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    traces = notes.read_text().split()
    assert traces and set(traces) == {str(deterministic)}, traces


# Between them: one device and two replicas, the tutorial's loop and many steps per tf.function call.
@pytest.mark.parametrize(
    "overrides",
    [
        ("strategy=mirrored", "strategy.cpu_replicas=2", "batch=32"),
        ("strategy=one_device", "loop=multi_step", "loop.steps_per_call=5"),
    ],
    ids=["mirrored-2-replicas", "one_device-multi_step"],
)
def test_two_invocations_give_bit_identical_metrics_and_weights(tmp_path, overrides):
    first = _train(tmp_path, "first", *overrides)
    second = _train(tmp_path, "second", *overrides)
    _assert_identical(first, second)
    losses = [value for _, value in first["metrics"]["train_loss"]]
    assert losses[-1] < losses[0]  # it trained


def test_kill_9_after_epoch_2_and_resume_equals_the_uninterrupted_run(tmp_path):
    """loop=multi_step draws from one iterator for the whole run: the resumed run must skip exactly the
    batches of the epochs it restored, and continue Adam's state and the learning-rate schedule."""
    overrides = (
        "strategy=one_device",
        "loop=multi_step",
        "loop.steps_per_call=5",
        "dataset.train_examples=2048",
        "epochs=6",
    )
    uninterrupted = _train(tmp_path, "uninterrupted", *overrides)

    process = start_cli(*_args(tmp_path, "killed", *overrides), cwd=tmp_path)
    # TensorFlow writes the `checkpoint` file that lists the checkpoints once a save is complete.
    wait_for(lambda: (tmp_path / "killed" / "checkpoints" / "checkpoint").exists(), what="the checkpoint after epoch 2")
    process.kill()
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    # Killed during epoch 3 (or, on a slow machine, after the next checkpoint, epoch 4). The newest checkpoint
    # is the one TensorFlow's `checkpoint` file names: a kill during a save leaves that file at the one before.
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(tmp_path / "killed" / "checkpoints"))
    step = int(latest.rsplit("-", 1)[1])  # checkpoints are named by global step
    assert step in (2 * 2048 // 64, 4 * 2048 // 64), latest

    resumed = run_cli(*_args(tmp_path, "killed", *overrides), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming after epoch {step // (2048 // 64)} from {latest}" in resumed.stdout + resumed.stderr
    _assert_identical(uninterrupted, _outcome(tmp_path, "killed"), epochs=6)


def test_parameter_server_is_refused_with_one_paragraph(tmp_path):
    done = run_cli(
        *_args(tmp_path, "ps", "strategy=parameter_server", "cluster=local", "loop.steps_per_epoch=5"),
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith(
        "error: runtime.deterministic=True is not valid: strategy=parameter_server trains asynchronously"
    )
    assert "Fix:" in line
    assert not (tmp_path / "mlflow.db").exists()  # refused before anything was tracked


def test_an_op_without_a_deterministic_xla_kernel_is_one_paragraph_and_a_failed_run(tmp_path):
    """TensorFlow finds that XLA has no deterministic MaxPool gradient only when the CNN's first step runs: the run
    ends FAILED with the paragraph, exit 2, instead of a traceback."""
    done = run_cli(
        *TINY,
        "strategy=one_device",
        "runtime.deterministic=true",
        "runtime.jit_compile=true",
        f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith(
        "error: runtime.deterministic=true cannot train this model: TensorFlow has no deterministic kernel for one of "
        'its ops under XLA (runtime.jit_compile=true): "GPU MaxPool gradient ops do not yet have a deterministic XLA '
        'implementation". Fix: drop runtime.jit_compile=true'
    ), line
    [run] = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}").search_runs(["1"])
    assert run.info.status == "FAILED" and run.data.tags["error"].endswith(line.removeprefix("error: "))

"""Nothing a run has written is lost: kill -9 and resume, SIGTERM, a diverging loss, and bad input.

Every scenario runs `python -m runner` in real processes against a real MLflow store.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY, metric_history, mlflow_client, run_cli, start_cli
from processes import children, is_running
from test_data import write_fashion_mnist, write_idx

pytestmark = pytest.mark.slow

# Three epochs of a few seconds each, a checkpoint after every epoch.
RUN = [*TINY, "dataset.train_examples=4096", "epochs=3", "checkpoint.every_epochs=1", "strategy=one_device",
       "seed=3"]
EPOCH_METRICS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "examples_per_second",
                 "learning_rate")


def _args(tmp_path: Path, name: str, *extra: str) -> list[str]:
    return [*RUN, f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", f"hydra.run.dir={tmp_path / name}",
            *extra]


def _client(tmp_path: Path):
    return mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")


def _run_id(tmp_path: Path, name: str) -> str:
    return (tmp_path / name / "mlflow_run_id.txt").read_text().strip()


def _wait_for(condition, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _checkpoints(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("ckpt-*.index"))


def _assert_each_epoch_logged_once(client, run_id: str, epochs: int = 3) -> None:
    for key in EPOCH_METRICS:
        steps = [step for step, _ in metric_history(client, run_id, key)]
        assert steps == list(range(1, epochs + 1)), (key, steps)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The reference: the same run, never interrupted."""
    tmp_path = tmp_path_factory.mktemp("reference")
    done = run_cli(*_args(tmp_path, "run"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    client = _client(tmp_path)
    return {key: [v for _, v in metric_history(client, _run_id(tmp_path, "run"), key)]
            for key in ("train_loss", "test_accuracy")}


def _resume_and_check(tmp_path: Path, name: str, reference) -> None:
    run_id = _run_id(tmp_path, name)
    done = run_cli(*_args(tmp_path, name), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    client = _client(tmp_path)
    assert _run_id(tmp_path, name) == run_id
    [run] = client.search_runs([client.get_experiment_by_name("fashion_mnist").experiment_id])
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    _assert_each_epoch_logged_once(client, run_id)
    # Same seed, same batches per epoch, state restored: the resumed run is the uninterrupted one.
    losses = [v for _, v in metric_history(client, run_id, "train_loss")]
    np.testing.assert_allclose(losses, reference["train_loss"], rtol=1e-4)
    accuracy = [v for _, v in metric_history(client, run_id, "test_accuracy")]
    np.testing.assert_allclose(accuracy, reference["test_accuracy"], atol=1e-6)


def test_kill_9_during_an_epoch_resumes_the_same_run_exactly(tmp_path, uninterrupted):
    process = start_cli(*_args(tmp_path, "run"), cwd=tmp_path)
    _wait_for(lambda: _checkpoints(tmp_path / "run"), what="the first checkpoint")
    time.sleep(1.0)  # into epoch 2
    helpers = children(process.pid)  # the MLflow tracker process (runner.tracking.tracker_process) among them
    assert helpers
    process.kill()
    process.wait()
    assert process.returncode == -signal.SIGKILL
    _wait_for(lambda: not any(is_running(pid) for pid in helpers), timeout=10,
              what="the training process's helpers to end with it")
    _resume_and_check(tmp_path, "run", uninterrupted)


def test_kill_9_before_the_first_checkpoint_starts_over_in_the_same_run(tmp_path, uninterrupted):
    process = start_cli(*_args(tmp_path, "run"), cwd=tmp_path)
    _wait_for(lambda: (tmp_path / "run" / "mlflow_run_id.txt").exists(), what="the MLflow run")
    process.kill()
    process.wait()
    assert not _checkpoints(tmp_path / "run")
    _resume_and_check(tmp_path, "run", uninterrupted)


def test_a_torn_newest_checkpoint_is_never_restored(tmp_path, uninterrupted):
    """A checkpoint whose data file was cut short (a write interrupted, a copy gone wrong) is skipped."""
    process = start_cli(*_args(tmp_path, "run"), cwd=tmp_path)
    _wait_for(lambda: len(_checkpoints(tmp_path / "run")) >= 2, what="two checkpoints")
    process.kill()
    process.wait()
    newest = _checkpoints(tmp_path / "run")[-1]
    [data_file] = newest.parent.glob(newest.name.replace(".index", ".data-*"))
    data_file.write_bytes(data_file.read_bytes()[:100])
    _resume_and_check(tmp_path, "run", uninterrupted)


def test_sigterm_saves_marks_killed_and_the_rerun_finishes(tmp_path, uninterrupted):
    process = start_cli(*_args(tmp_path, "run"), cwd=tmp_path)
    _wait_for(lambda: _checkpoints(tmp_path / "run"), what="the first checkpoint")
    time.sleep(1.0)
    before = len(_checkpoints(tmp_path / "run"))
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert time.monotonic() - sent < 30
    assert process.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "preempted:" in stderr and "Traceback" not in stderr
    assert len(_checkpoints(tmp_path / "run")) == before + 1  # saved at the step boundary
    client = _client(tmp_path)
    run = client.get_run(_run_id(tmp_path, "run"))
    assert run.info.status == "KILLED" and run.data.tags["resumable"] == "true"
    done = run_cli(*_args(tmp_path, "run"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["resumable"] == "false"
    _assert_each_epoch_logged_once(client, run.info.run_id)


def test_a_diverging_loss_stops_with_epoch_and_step_and_fails_the_run(tmp_path):
    done = run_cli(*_args(tmp_path, "run", "optimizer.lr=1e6"), cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "loss became NaN or infinite at epoch 1, step" in line and "optimizer.lr" in line
    run = _client(tmp_path).get_run(_run_id(tmp_path, "run"))
    assert run.info.status == "FAILED" and "NaN or infinite" in run.data.tags["error"]
    assert not _checkpoints(tmp_path / "run")  # no checkpoint of diverged weights


def _malformed_idx_dir(tmp_path: Path) -> str:
    (tmp_path / "idx").mkdir()
    write_fashion_mnist(tmp_path / "idx")
    (tmp_path / "idx" / "train-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8b not really gzip")
    return str(tmp_path / "idx")


def _other_model_checkpoint(tmp_path: Path) -> str:
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.layers.Dense(3)])
    model.build((None, 5))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(tmp_path / "other" / "checkpoints"), 1)
    manager.save()
    return str(tmp_path / "other")


BAD_INPUT = {
    "batch=0": lambda tmp: (["batch=0"], "batch=0 is not valid"),
    "batch=-3": lambda tmp: (["batch=-3"], "batch=-3 is not valid"),
    "batch=abc": lambda tmp: (["batch=abc"], "batch='abc' is not valid"),
    "epochs=0": lambda tmp: (["epochs=0"], "epochs=0 is not valid"),
    "unknown strategy": lambda tmp: (["strategy=magic"], "Could not find 'strategy/magic'"),
    "unknown loop": lambda tmp: (["loop=fast"], "Could not find 'loop/fast'"),
    "unknown dataset": lambda tmp: (["dataset=mnist"], "Could not find 'dataset/mnist'"),
    "unknown lr_scaling": lambda tmp: (["lr_scaling=cubic"], "Could not find 'lr_scaling/cubic'"),
    "missing dataset.dir": lambda tmp: (["dataset=fashion_mnist", f"dataset.dir={tmp}/nowhere"], "dataset.dir="),
    "malformed IDX": lambda tmp: (["dataset=fashion_mnist", f"dataset.dir={_malformed_idx_dir(tmp)}",
                                   "dataset.train_examples=null", "dataset.test_examples=null"],
                                  "train-labels-idx1-ubyte.gz"),
    "tpu without a TPU": lambda tmp: (["strategy=tpu"], "strategy=tpu found no TPU"),
    "cpu_replicas with one_device": lambda tmp: (["strategy.cpu_replicas=2"], "strategy.cpu_replicas=2 is not valid"),
    "tracking server down": lambda tmp: (["mlflow.tracking_uri=http://127.0.0.1:9"], "does not answer"),
    "checkpoint of another model": lambda tmp: ([f"hydra.run.dir={_other_model_checkpoint(tmp)}"],
                                                "does not fit this model"),
    "resume=never over checkpoints": lambda tmp: (["resume=never", f"hydra.run.dir={_other_model_checkpoint(tmp)}"],
                                                  "resume=never, but"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_fails_fast_with_one_paragraph_and_leaves_nothing_running(tmp_path, case):
    overrides, expected = BAD_INPUT[case](tmp_path)
    args = [*RUN, f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", f"hydra.run.dir={tmp_path / 'run'}",
            *overrides]
    started = time.monotonic()
    done = run_cli(*args, cwd=tmp_path, timeout=60)
    assert time.monotonic() - started < 30
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert expected in done.stderr, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    if not expected.startswith("Could not find"):  # Hydra reports unknown options itself
        assert len(errors) == 1 and expected in errors[0]
    if (tmp_path / "mlflow.db").exists():
        client = _client(tmp_path)
        experiments = [e.experiment_id for e in client.search_experiments()]
        assert all(r.info.status != "RUNNING" for r in client.search_runs(experiments))

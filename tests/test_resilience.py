"""Nothing a run has written is lost: kill -9 and resume, SIGTERM, a diverging loss, and bad input.

Every scenario runs `python -m runner` in real processes against a real MLflow store.
"""

from __future__ import annotations

import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import run_cli, start_cli
from helpers.data import write_fashion_mnist
from helpers.preemption import checkpoints
from helpers.presets import TINY, WITH_MODEL
from helpers.processes import children, is_running
from helpers.tracking import metric_history, mlflow_client
from helpers.turns import alone_now
from helpers.waiting import wait_for
from runner import outcome
from runner.outcome import OUTCOME_FILE

pytestmark = pytest.mark.slow

# Three epochs of a few seconds each, a checkpoint after every epoch.
RUN = [*TINY, "dataset.train_examples=4096", "epochs=3", "checkpoint.every_epochs=1", "strategy=one_device", "seed=3"]
EPOCH_METRICS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "examples_per_second", "learning_rate")


def _args(tmp_path: Path, name: str, *extra: str) -> list[str]:
    # The store is relative to the working directory (tmp_path, where every run starts): a copy of tmp_path is
    # the same run with the same params.
    return [*RUN, "mlflow.tracking_uri=sqlite:///mlflow.db", f"hydra.run.dir={tmp_path / name}", *extra]


def _client(tmp_path: Path):
    return mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")


def _run_id(tmp_path: Path, name: str) -> str:
    return (tmp_path / name / "mlflow_run_id.txt").read_text().strip()


# _INTO_EPOCH_2: the signal (SIGTERM, or the kill -9 of a test "during an epoch") to a single-process run must land
# after a step of epoch 2, and nothing the run writes says that a step of epoch 2 is done: no progress bar without a
# terminal, and the first checkpoint comes before epoch 2 starts (a SIGTERM then stops the run at the epoch boundary,
# with no step of epoch 2 to resume). So these tests let it train a while past that checkpoint.


def _assert_each_epoch_logged_once(client, run_id: str, epochs: int = 3) -> None:
    for key in EPOCH_METRICS:
        steps = [step for step, _ in metric_history(client, run_id, key)]
        assert steps == list(range(1, epochs + 1)), (key, steps)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The reference: the same run, never interrupted (its store and run directory stay in reference.dir)."""
    tmp_path = tmp_path_factory.mktemp("reference")
    done = run_cli(*_args(tmp_path, "run"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    client = _client(tmp_path)
    reference = {
        key: [v for _, v in metric_history(client, _run_id(tmp_path, "run"), key)]
        for key in ("train_loss", "test_accuracy")
    }
    return Reference(tmp_path, done.stdout + done.stderr, reference)


@dataclass(frozen=True)
class Reference:
    dir: Path  # holds mlflow.db and the finished run directory `run`
    output: str  # the run's stdout and stderr
    metrics: dict[str, list[float]]

    def __getitem__(self, key: str) -> list[float]:
        return self.metrics[key]


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


def _refused_as_a_duplicate(tmp_path: Path, holder: int) -> None:
    """The same command again while `holder` runs in the directory: refused at once, nothing touched."""
    run_dir = tmp_path / "run"

    def written():
        # Not the lock, nor the journal that the holder's tracker process (not stopped with it) keeps writing.
        return {
            path: path.stat().st_mtime_ns
            for path in run_dir.rglob("*")
            if path.name != ".runner.lock"
            and not path.name.startswith("mlflow_journal")
            and "mlflow_journal" not in path.parts
        }

    before = written()
    started = time.monotonic()
    done = run_cli(*_args(tmp_path, "run"), cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert time.monotonic() - started < 60  # before TensorFlow or MLflow load
    [paragraph] = done.stderr.strip().splitlines()
    assert paragraph.startswith(f"error: hydra.run.dir={run_dir} is in use by another runner process (pid {holder}")
    assert "Fix:" in paragraph and f"kill {holder}" in paragraph
    assert written() == before
    client = _client(tmp_path)
    assert len(client.search_runs([client.get_experiment_by_name("fashion_mnist").experiment_id])) == 1


def test_kill_9_during_an_epoch_resumes_the_same_run_exactly(tmp_path, uninterrupted):
    """A second process in the run directory is refused while the first holds it; once the first is killed
    outright its hold is gone with it, and the same command resumes."""
    process = start_cli(*_args(tmp_path, "run"), cwd=tmp_path)
    wait_for(lambda: checkpoints(tmp_path / "run"), what="the first checkpoint")
    time.sleep(1.0)  # into epoch 2: a sleep on purpose (_INTO_EPOCH_2)
    helpers = children(process.pid)  # the MLflow tracker process (runner.tracking.tracker_process) among them
    assert helpers
    process.send_signal(signal.SIGSTOP)  # holds the directory, however long the duplicate takes
    _refused_as_a_duplicate(tmp_path, process.pid)
    process.kill()
    process.wait()
    assert process.returncode == -signal.SIGKILL
    wait_for(
        lambda: not any(is_running(pid) for pid in helpers),
        timeout=30,
        what="the training process's helpers to end with it",
    )
    _resume_and_check(tmp_path, "run", uninterrupted)


def test_kill_9_before_the_first_checkpoint_starts_over_in_the_same_run(tmp_path, uninterrupted):
    process = start_cli(*_args(tmp_path, "run"), cwd=tmp_path)
    wait_for(lambda: (tmp_path / "run" / "mlflow_run_id.txt").exists(), what="the MLflow run")
    process.kill()
    process.wait()
    assert not checkpoints(tmp_path / "run")
    _resume_and_check(tmp_path, "run", uninterrupted)


def _cut(path: Path, size) -> None:
    content = path.read_bytes()
    path.write_bytes(content[: size(len(content))])


def _data_file(index: Path) -> Path:
    [data_file] = index.parent.glob(index.name.replace(".index", ".data-*"))
    return data_file


# Each case damages several checkpoints of a finished run, newest first, in the ways a write or a copy can be
# cut short or lost; the re-run skips each damaged one with one warning naming it. (Each damage on its own,
# in-process: test_checkpoints.py.)
DAMAGES = {
    "data cut to 100 bytes, index empty, state file garbled": (
        lambda newest, older, oldest, state: (
            _cut(_data_file(newest), lambda n: 100),
            _cut(older, lambda n: 0),
            state.write_text("model_checkpoint_path: {{ garbled"),
        ),
        1,
    ),
    "data cut to 0 bytes, data file missing, index cut to half, state file empty: none readable": (
        lambda newest, older, oldest, state: (
            _cut(_data_file(newest), lambda n: 0),
            _data_file(older).unlink(),
            _cut(oldest, lambda n: n // 2),
            state.write_text(""),
        ),
        0,
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_checkpoints_are_skipped_for_the_newest_readable_one(tmp_path, uninterrupted, damage):
    """Checkpoints cut short, emptied, lost or listed in a garbled state file are skipped, newest first; none
    readable starts over; either way the same MLflow run finishes with each epoch logged once, and the epochs
    trained again reproduce the reference exactly (no variable was restored from a damaged file)."""
    shutil.copytree(uninterrupted.dir, tmp_path, dirs_exist_ok=True)
    run_dir = tmp_path / "run"
    newest, older, oldest = reversed(checkpoints(run_dir))
    harm, resumed_epoch = DAMAGES[damage]
    harm(newest, older, oldest, run_dir / "checkpoints" / "checkpoint")
    run_id = _run_id(tmp_path, "run")
    done = run_cli(*_args(tmp_path, "run"), cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in output, output[-3000:]
    skipped = [line for line in output.splitlines() if "is unreadable" in line]
    assert [name for name in ("ckpt-192", "ckpt-128", "ckpt-64") if any(f"/{name} " in line for line in skipped)] == [
        "ckpt-192",
        "ckpt-128",
        "ckpt-64",
    ][: 3 - resumed_epoch], skipped
    if resumed_epoch:
        assert f"resuming after epoch {resumed_epoch} from {oldest.with_suffix('')}" in output, output[-3000:]
    else:
        assert "no checkpoint in" in output and "starting over" in output, output[-3000:]
    retrained = {int(epoch): float(loss) for epoch, loss in re.findall(r"epoch (\d)/3: train_loss ([0-9.]+)", output)}
    assert sorted(retrained) == list(range(resumed_epoch + 1, 4)), output[-3000:]
    for epoch, loss in retrained.items():
        assert loss == pytest.approx(uninterrupted["train_loss"][epoch - 1], abs=1.5e-4), (epoch, loss)
    client = _client(tmp_path)
    assert _run_id(tmp_path, "run") == run_id
    [run] = client.search_runs([client.get_experiment_by_name("fashion_mnist").experiment_id])
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    _assert_each_epoch_logged_once(client, run_id)


def test_sigterm_saves_marks_killed_and_the_rerun_finishes(tmp_path, uninterrupted):
    # Enough epochs that the signal lands mid-run however fast the machine trains one.
    args = _args(tmp_path, "run", "epochs=8")
    # From its start: the signal must land mid-run, and the run must stop within 30 s of it.
    with alone_now():
        process = start_cli(*args, cwd=tmp_path)
        wait_for(lambda: checkpoints(tmp_path / "run"), what="the first checkpoint")
        time.sleep(1.0)  # into epoch 2 or later: a sleep on purpose (_INTO_EPOCH_2)
        before = checkpoints(tmp_path / "run")
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        assert time.monotonic() - sent < 30
    assert process.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "preempted:" in stderr and "Traceback" not in stderr
    # Saved at the step boundary: one checkpoint newer than any before the signal (the manager may have let the
    # oldest go: it keeps checkpoint.max_to_keep, and a quiet machine trains three epochs in the second above).
    after = checkpoints(tmp_path / "run")
    assert [path for path in after if path not in before] == after[-1:], (before, after)
    # Whoever started it reads the same paragraph from its outcome file.
    ended = outcome.read(str(tmp_path / "run" / OUTCOME_FILE), None)
    [said] = [line for line in stderr.splitlines() if line.startswith("preempted: ")]
    assert (ended.status, ended.exit_code, ended.resumable, ended.paragraph) == ("KILLED", 143, True, said)
    client = _client(tmp_path)
    run = client.get_run(_run_id(tmp_path, "run"))
    assert run.info.status == "KILLED" and run.data.tags["resumable"] == "true"
    assert ended.run_id == run.info.run_id  # the run to resume, named where the supervisor reads
    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["resumable"] == "false"
    _assert_each_epoch_logged_once(client, run.info.run_id, epochs=8)
    ended = outcome.read(str(tmp_path / "run" / OUTCOME_FILE), None)
    assert (ended.status, ended.run_id) == ("FINISHED", run.info.run_id)
    assert ended.metrics["test_accuracy"] == pytest.approx(run.data.metrics["test_accuracy"])


def test_runs_started_together_on_a_fresh_store_all_finish(tmp_path):
    """Four single runs at once against one new sqlite file (two terminals, a SLURM array): the first to get there
    creates and migrates the store, the others wait for it (runner.tracking.store)."""
    processes = [
        start_cli(
            *TINY,
            "strategy=one_device",
            "mlflow.tracking_uri=sqlite:///mlflow.db",
            f"hydra.run.dir={tmp_path / f'run{index}'}",
            cwd=tmp_path,
        )
        for index in range(4)
    ]
    outputs = [process.communicate(timeout=600) for process in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
    client = _client(tmp_path)
    runs = client.search_runs([client.get_experiment_by_name("fashion_mnist").experiment_id])
    assert len(runs) == 4 and {run.info.status for run in runs} == {"FINISHED"}


def test_a_diverging_loss_stops_with_epoch_and_step_and_fails_the_run(tmp_path):
    done = run_cli(*_args(tmp_path, "run", "optimizer.lr=1e6", WITH_MODEL), cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "loss became NaN or infinite at epoch 1, step" in line and "optimizer.lr" in line
    run = _client(tmp_path).get_run(_run_id(tmp_path, "run"))
    assert run.info.status == "FAILED" and "NaN or infinite" in run.data.tags["error"]
    ended = outcome.read(str(tmp_path / "run" / OUTCOME_FILE), None)
    assert (ended.status, ended.run_id, ended.paragraph) == ("FAILED", run.info.run_id, line)
    assert not checkpoints(tmp_path / "run")  # no checkpoint of diverged weights
    assert _client(tmp_path).search_logged_models([run.info.experiment_id]) == []  # a FAILED run has no model


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


EARLIER_RUN_ID = "0123456789abcdef0123456789abcdef"


def _earlier_run(tmp_path: Path) -> str:
    """A run directory an earlier run left: its checkpoints and its MLflow run's id."""
    run_dir = _other_model_checkpoint(tmp_path)
    (Path(run_dir) / "mlflow_run_id.txt").write_text(EARLIER_RUN_ID + "\n")
    return run_dir


BAD_INPUT = {
    "batch=0": lambda tmp: (["batch=0"], "batch=0 is not valid"),
    "batch=-3": lambda tmp: (["batch=-3"], "batch=-3 is not valid"),
    "batch=abc": lambda tmp: (["batch=abc"], "batch='abc' is not valid"),
    "epochs=0": lambda tmp: (["epochs=0"], "epochs=0 is not valid"),
    "unknown strategy": lambda tmp: (
        ["strategy=magic"],
        "strategy=magic is not valid: the strategy group has no option 'magic'",
    ),
    "unknown loop": lambda tmp: (["loop=fast"], "loop=fast is not valid: the loop group has no option 'fast'"),
    "unknown dataset": lambda tmp: (
        ["dataset=mnist"],
        "dataset=mnist is not valid: the dataset group has no option 'mnist'",
    ),
    "unknown lr_scaling": lambda tmp: (
        ["lr_scaling=cubic"],
        "lr_scaling=cubic is not valid: the lr_scaling group has no option 'cubic'",
    ),
    "missing dataset.dir": lambda tmp: (["dataset=fashion_mnist", f"dataset.dir={tmp}/nowhere"], "dataset.dir="),
    "malformed IDX": lambda tmp: (
        [
            "dataset=fashion_mnist",
            f"dataset.dir={_malformed_idx_dir(tmp)}",
            "dataset.train_examples=null",
            "dataset.test_examples=null",
        ],
        "train-labels-idx1-ubyte.gz",
    ),
    "tpu without a TPU": lambda tmp: (["strategy=tpu"], "strategy=tpu found no TPU"),
    "cpu_replicas with one_device": lambda tmp: (["strategy.cpu_replicas=2"], "strategy.cpu_replicas=2 is not valid"),
    "tracking server down": lambda tmp: (["mlflow.tracking_uri=http://127.0.0.1:9"], "does not answer"),
    "checkpoint of another model": lambda tmp: (
        [f"hydra.run.dir={_other_model_checkpoint(tmp)}"],
        "does not fit this model",
    ),
    "resume=never over checkpoints": lambda tmp: (
        ["resume=never", f"hydra.run.dir={_other_model_checkpoint(tmp)}"],
        "resume=never, but",
    ),
    "resume=never over an earlier run": lambda tmp: (
        ["resume=never", f"hydra.run.dir={_earlier_run(tmp)}"],
        f"checkpoints of an earlier run (MLflow run {EARLIER_RUN_ID}, newest {tmp}/other/checkpoints/ckpt-1), which",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_fails_fast_with_one_paragraph_and_leaves_nothing_running(tmp_path, case):
    overrides, expected = BAD_INPUT[case](tmp_path)
    args = [
        *RUN,
        f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"hydra.run.dir={tmp_path / 'run'}",
        *overrides,
    ]
    started = time.monotonic()
    done = run_cli(*args, cwd=tmp_path, timeout=60)
    assert time.monotonic() - started < 30
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert expected in done.stderr, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0]
    assert "(None)" not in errors[0]  # nothing unknown is named as if it were a value
    if (tmp_path / "mlflow.db").exists():
        client = _client(tmp_path)
        experiments = [e.experiment_id for e in client.search_experiments()]
        assert all(r.info.status != "RUNNING" for r in client.search_runs(experiments))


# Enough steps per epoch (128) that a SIGTERM sent just after the first checkpoint lands inside epoch 2.
DETERMINISTIC = ["dataset.train_examples=8192", "runtime.deterministic=true"]
EXACT_METRICS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "learning_rate")


@pytest.mark.parametrize(
    ("loop", "keras"), [("for_in", 2), ("multi_step", 2), ("for_in", 3)], ids=["for_in", "multi_step", "keras3"]
)
def test_sigterm_mid_epoch_then_resume_is_bit_identical_to_the_uninterrupted_run(tmp_path, loop, keras):
    """The preemption checkpoint holds the steps of epoch 2 already trained and their losses and accuracy:
    the resume skips exactly the batches they consumed and epoch 2's metrics still cover all of its steps. The
    same for the CNN built with Keras 3 (its Adam's state in the checkpoint) under runtime.deterministic."""
    args = [
        *DETERMINISTIC,
        f"loop={loop}",
        f"runtime.keras={keras}",
        *(["loop.steps_per_call=4"] if loop == "multi_step" else []),
    ]
    reference = run_cli(*_args(tmp_path, "reference", *args), cwd=tmp_path)
    assert reference.returncode == 0, reference.stderr[-3000:]

    process = start_cli(*_args(tmp_path, "run", *args), cwd=tmp_path)
    wait_for(lambda: checkpoints(tmp_path / "run"), what="the first checkpoint")
    time.sleep(0.5)  # into epoch 2: a sleep on purpose (_INTO_EPOCH_2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    client = _client(tmp_path)
    run_id = _run_id(tmp_path, "run")
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["resumable"] == "true"

    resumed = run_cli(*_args(tmp_path, "run", *args), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = resumed.stdout + resumed.stderr
    assert "resuming after epoch 1 and " in said, said[-3000:]
    [done_steps] = re.findall(r"resuming after epoch 1 and (\d+) step\(s\) of the next epoch", said)
    assert 0 < int(done_steps) < 128, said[-2000:]
    if loop == "multi_step":
        assert int(done_steps) % 4 == 0  # stopped between calls of 4 steps
    _assert_each_epoch_logged_once(client, run_id)
    assert client.get_run(run_id).info.status == "FINISHED"
    expected = client.get_run(_run_id(tmp_path, "reference")).info.run_id
    for key in EXACT_METRICS:
        assert metric_history(client, run_id, key) == metric_history(client, expected, key), key

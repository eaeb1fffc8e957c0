"""Training never waits for the tracking server: a real `mlflow server` stopped and started again on the same port
while `python -m runner` trains against it (runner.tracking.tracker_process, journal, delivery, replay).

Each scenario runs once: an outage during training (the epochs' wall times stay as without it, and the run ends
whole), an outage across the end of the run (the process ends, its journal holds the rest, the replay command
delivers it), and kill -9 during an outage followed by a resume (nothing logged before the kill is lost, each
epoch is logged once).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.cli import cli_env
from helpers.presets import TINY, WITH_MODEL
from helpers.processes import children, is_running, wait_group
from helpers.servers import MlflowServer
from helpers.tracking import metric_history, mlflow_client
from helpers.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.server]

EPOCH_METRICS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "examples_per_second", "learning_rate")
# One device, a checkpoint after every epoch (each one an artifact handed over while the server may be down),
# system metrics every second (sampled and journaled in the tracker process throughout). mlflow.checkpoints=all:
# every save goes to the run as it is written, also those rotated away in the run directory during the outage.
RUN = [
    *TINY,
    "strategy=one_device",
    "checkpoint.every_epochs=1",
    "mlflow.system_metrics.interval_seconds=1",
    "mlflow.checkpoints=all",
    "seed=5",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One `mlflow server` on a free loopback port for the module; each test stops and starts it again there."""
    root = tmp_path_factory.mktemp("server")
    server = MlflowServer(f"sqlite:///{root / 'server.db'}", root / "artifacts", root / "mlflow-server.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def up(server):
    """The server, answering at the start of the test and stopped or restarted only inside it."""
    if server.process is None or server.process.poll() is not None:
        server.start()
    yield server
    if server.process is None or server.process.poll() is not None:
        server.start()  # the next test starts with it up


def _stop(server: MlflowServer) -> None:
    """The server goes away at once, as in a crash (SIGTERM lets it take seconds over its shutdown, while the
    training the test times goes on)."""
    os.killpg(server.process.pid, signal.SIGKILL)
    assert wait_group(server.process, 30)


def _outage(server: MlflowServer, seconds: float) -> tuple[float, float]:
    """Stop the server for `seconds`, then start it again on its port; when it went and when it answered again."""
    _stop(server)
    stopped = time.time()
    time.sleep(seconds)  # a sleep on purpose: the outage lasts `seconds`
    server.start()
    return stopped, time.time()


@pytest.fixture
def trainings():
    """Every training process a test starts; any still running when it ends is killed."""
    started: list[Training] = []
    yield started
    for training in started:
        if training.process is not None and training.process.poll() is None:
            training.process.kill()
            training.process.wait()


class Training:
    """`python -m runner` in the background, its output in a file (read it whenever)."""

    def __init__(
        self, trainings: list, tmp_path: Path, name: str, server: MlflowServer, *overrides: str, run: tuple = tuple(RUN)
    ):
        trainings.append(self)
        self.run_dir = tmp_path / name
        self.args = [*run, f"mlflow.tracking_uri={server.url}", f"hydra.run.dir={self.run_dir}", *overrides]
        self.tmp_path = tmp_path
        self.log = tmp_path / f"{name}.out"
        self.process: subprocess.Popen | None = None

    def start(self) -> Training:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "runner", *self.args],
                cwd=self.tmp_path,
                env=cli_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def wait(self, timeout: float = 300) -> int:
        try:
            return self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def run_id(self) -> str:
        return (self.run_dir / "mlflow_run_id.txt").read_text().strip()

    def checkpoints(self) -> list[int]:
        return sorted(int(path.name[5:-6]) for path in (self.run_dir / "checkpoints").glob("ckpt-*.index"))


def _epochs_logged(client, training: Training) -> int:
    try:
        return len(metric_history(client, training.run_id, "train_loss"))
    except Exception:
        return 0


def _assert_the_run_is_whole(client, run_id: str, epochs: int, run_dir: Path, checkpoints: int | None = None) -> None:
    """FINISHED, each epoch's metrics once, every checkpoint ever saved and the run's files as artifacts, the
    journal delivered and gone."""
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED", run.info
    for key in EPOCH_METRICS:
        assert [step for step, _ in metric_history(client, run_id, key)] == list(range(1, epochs + 1)), key
    assert [step for step, _ in metric_history(client, run_id, "eval_accuracy")] == [epochs]
    top = {artifact.path for artifact in client.list_artifacts(run_id)}
    assert {"config.yaml", "overrides.yaml", "curves.png", "checkpoints"} <= top, top
    saved = {artifact.path.split("/")[-1] for artifact in client.list_artifacts(run_id, "checkpoints")}
    numbers = sorted(int(name[5:-6]) for name in saved if name.endswith(".index"))  # ckpt-<global step>
    # Every checkpoint saved, also those rotated away in the run directory while the server was down.
    assert len(numbers) == (checkpoints or epochs), sorted(saved)
    assert all(f"ckpt-{number}.data-00000-of-00001" in saved for number in numbers), sorted(saved)
    assert any(key.startswith("system/") for key in run.data.metrics)
    assert not (run_dir / "mlflow_journal.jsonl").exists() and not (run_dir / "mlflow_journal").exists()


def _epoch_seconds(client, run_id: str) -> list[float]:
    """Each epoch's wall time, from one epoch's metrics being handed to the tracker to the next one's (training,
    evaluation, the checkpoint and every tracker call in between); the first from the run's start."""
    stamps = [m.timestamp for m in sorted(client.get_metric_history(run_id, "train_loss"), key=lambda m: m.step)]
    return [(later - earlier) / 1000 for earlier, later in zip(stamps, stamps[1:], strict=False)]


def _once(output: str, words: str) -> None:
    lines = [line for line in output.splitlines() if words in line]
    assert len(lines) == 1, (words, lines, output[-4000:])


def test_a_quiet_run_on_a_tracking_server_shows_no_mlflow_links_of_its_own(tmp_path, up, trainings):
    """MLflow's client prints "View run ... at: ..." and "View experiment at: ..." when it ends a run on a server;
    a run that is quiet by default shows only the runner's own link (its `MLflow UI:` line)."""
    training = Training(trainings, tmp_path, "quiet", up, "epochs=1").start()
    code = training.wait()
    output = training.output
    assert code == 0 and "Traceback" not in output, output[-4000:]
    assert mlflow_client(up.url).get_run(training.run_id).info.status == "FINISHED"  # ended on the server
    assert "View run" not in output and "View experiment" not in output, output[-4000:]
    _once(output, "MLflow UI: ")


@pytest.mark.alone  # its epoch times during and outside the outage are compared
def test_an_outage_during_training_neither_stops_nor_slows_it_and_the_run_ends_whole(tmp_path, up, trainings):
    outage, epochs = 25.0, 35  # a checkpoint every 5 epochs, the last one included
    # About 1.5 s per epoch here (at least 10 in the outage, and epochs after it), a checkpoint every 5 (with 3 kept,
    # those of the outage's first epochs are gone from the run directory before the server is back).
    training = Training(
        trainings, tmp_path, "run", up, f"epochs={epochs}", "dataset.train_examples=4096", "checkpoint.every_epochs=5"
    ).start()
    client = mlflow_client(up.url)
    wait_for(lambda: _epochs_logged(client, training) >= 4, 180, "4 epochs before the outage", every=0.1)
    stopped, back = _outage(up, outage)
    code = training.wait()
    output = training.output
    assert code == 0 and "Traceback" not in output, output[-4000:]
    _once(output, "stopped answering")
    _once(output, "answers again after")
    assert "Retrying" not in output and "Failed to" not in output, output[-4000:]
    _assert_the_run_is_whole(client, training.run_id, epochs, training.run_dir, checkpoints=epochs // 5)

    seconds = _epoch_seconds(client, training.run_id)
    stamps = [
        m.timestamp / 1000
        for m in sorted(client.get_metric_history(training.run_id, "train_loss"), key=lambda m: m.step)
    ]
    during = [s for s, end in zip(seconds, stamps[1:], strict=False) if stopped < end - s and end < back]
    outside = [s for s, end in zip(seconds, stamps[1:], strict=False) if end < stopped or end - s > back]
    print(
        f"\nepoch wall times (s) through a {back - stopped:.0f} s outage: "
        f"during {[round(s, 2) for s in during]}, outside {[round(s, 2) for s in outside]}; medians "
        f"{statistics.median(during):.2f} during, {statistics.median(outside):.2f} outside"
    )
    assert len(during) >= 10 and len(outside) >= 3, (during, outside)
    # Had a tracker call waited for the server, one epoch would have taken about the whole outage. (On a machine
    # shared with other work single epochs vary by seconds either way; the medians show a slowdown.)
    assert max(during) < outage / 2, (during, outside)
    assert statistics.median(during) < 1.5 * statistics.median(outside) + 0.5, (during, outside)


@pytest.mark.alone  # the process must end within a minute of the outage, not after MLflow's back-off
def test_an_outage_across_the_end_leaves_a_journal_that_the_replay_command_delivers(tmp_path, up, trainings):
    training = Training(
        trainings, tmp_path, "run", up, "epochs=4", "dataset.train_examples=1024", "mlflow.outage_seconds=3", WITH_MODEL
    ).start()
    client = mlflow_client(up.url)
    wait_for(lambda: _epochs_logged(client, training) >= 1, 180, "the first epoch", every=0.1)
    _stop(up)
    started = time.monotonic()
    code = training.wait()
    output = training.output
    assert code == 0 and "Traceback" not in output, output[-4000:]
    assert time.monotonic() - started < 60  # it waited mlflow.outage_seconds at most, not MLflow's back-off
    _once(output, "stopped answering")
    _once(output, "did not reach the tracking store")
    _once(output, "is not logged now")  # the model: a re-run of the same command logs it
    [paragraph] = [line for line in output.splitlines() if "did not reach the tracking store" in line]
    assert f"python -m runner.tracking.replay {training.run_dir}" in paragraph
    assert "its end status" in paragraph and "metrics" in paragraph and "artifacts" in paragraph
    journal = training.run_dir / "mlflow_journal.jsonl"
    ops = [json.loads(line).get("op") for line in journal.read_text().splitlines()[1:]]
    assert ops[-1] == "end" and ops.count("log_metrics") >= 3, ops

    replay = [sys.executable, "-m", "runner.tracking.replay", str(training.run_dir)]
    down = subprocess.run(replay, capture_output=True, text=True, timeout=120, env=cli_env())
    assert (
        down.returncode == 2
        and down.stderr.startswith("error: the tracking server")
        and "does not answer" in down.stderr
        and "Traceback" not in down.stderr
    ), down.stderr
    assert journal.exists()
    up.start()
    done = subprocess.run(replay, capture_output=True, text=True, timeout=120, env=cli_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the run is FINISHED" in done.stdout, done.stdout
    _assert_the_run_is_whole(client, training.run_id, 4, training.run_dir)


def test_kill_9_during_an_outage_then_resume_loses_nothing_and_logs_each_epoch_once(tmp_path, up, trainings):
    training = Training(trainings, tmp_path, "run", up, "epochs=6", "dataset.train_examples=4096").start()
    client = mlflow_client(up.url)
    wait_for(lambda: _epochs_logged(client, training) >= 1, 180, "the first epoch", every=0.1)
    helpers = children(training.process.pid)
    _stop(up)
    steps = 4096 // 64
    wait_for(lambda: training.checkpoints()[-1:] >= [3 * steps], 180, "two epochs during the outage", every=0.1)
    assert "epoch 6/6" not in training.output  # killed while it trains
    training.process.send_signal(signal.SIGKILL)
    training.wait()
    wait_for(lambda: not any(is_running(pid) for pid in helpers), 30, "the tracker process to end", every=0.1)
    journal = training.run_dir / "mlflow_journal.jsonl"
    entries = [json.loads(line) for line in journal.read_text().splitlines()[1:]]
    delivered = int((training.run_dir / "mlflow_journal.delivered").read_text())
    kept = {
        entry["args"]["step"]: entry["args"]["metrics"]["train_loss"]
        for entry in entries
        if entry["op"] == "log_metrics" and "train_loss" in entry["args"]["metrics"] and entry["seq"] > delivered
    }
    assert len(kept) >= 2, entries  # epochs the server never saw

    up.start()
    training.start()  # the same command: resumes from the last checkpoint, delivering the journal first
    code = training.wait()
    output = training.output
    assert code == 0 and "Traceback" not in output, output[-4000:]
    assert "that an earlier invocation left in" in output
    _assert_the_run_is_whole(client, training.run_id, 6, training.run_dir)
    logged = dict(metric_history(client, training.run_id, "train_loss"))
    assert {step: logged[step] for step in kept} == kept  # the killed invocation's own numbers


@pytest.mark.alone  # its epochs' times during the outage are compared with the outage's length
def test_an_outage_during_a_multi_worker_run_stops_none_of_its_workers(tmp_path, up, trainings):
    """In a cluster the chief tracks through its own tracker process too: its workers, which train in step with
    it, never wait for the server either."""
    outage = 20.0
    cluster = tuple(item for item in RUN if not item.startswith("strategy=")) + (
        "strategy=multi_worker_mirrored",
        "cluster=local",
        "cluster.workers=2",
    )
    training = Training(
        trainings,
        tmp_path,
        "run",
        up,
        "epochs=30",
        "dataset.train_examples=2048",
        "checkpoint.every_epochs=10",
        run=cluster,
    ).start()
    client = mlflow_client(up.url)
    wait_for(lambda: _epochs_logged(client, training) >= 3, 180, "3 epochs before the outage", every=0.1)
    stopped, back = _outage(up, outage)
    code = training.wait()
    output = training.output
    assert code == 0 and "Traceback" not in output, output[-4000:]
    _once(output, "stopped answering")
    _assert_the_run_is_whole(client, training.run_id, 30, training.run_dir, checkpoints=3)
    stamps = [
        m.timestamp / 1000
        for m in sorted(client.get_metric_history(training.run_id, "train_loss"), key=lambda m: m.step)
    ]
    during = [later - earlier for earlier, later in zip(stamps, stamps[1:], strict=False) if stopped < earlier < back]
    print(f"\nepoch wall times (s) during a {back - stopped:.0f} s outage: {[round(s, 2) for s in during]}")
    assert len(during) >= 5, (during, stamps)
    # Had the chief's tracker calls waited for the server, the epoch the outage began in would have taken about
    # the whole outage, and its workers with it.
    assert max(during) < outage / 2, during

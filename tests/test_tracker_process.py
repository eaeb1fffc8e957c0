"""The chief's MLflow tracker in a child process: the same run as an in-process MlflowTracker records,
errors raised where the call was made, nothing created before the first call, no process left behind."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from helpers.config import mlflow_settings
from helpers.processes import is_running, settled
from helpers.tracking import metric_history, mlflow_client
from helpers.waiting import StartLine, wait_for
from runner.errors import RunnerError
from runner.tracking.run_id_file import RUN_ID_FILE


@dataclass(frozen=True)
class _Epoch:
    """What the controller hands its listeners (runner.training.controller.EpochResult), in the part trackers read."""

    epoch: int
    loss: float

    def metrics(self) -> dict[str, float]:
        return {"train_loss": self.loss}


@pytest.fixture
def tracker(tmp_path):
    from runner.tracking.tracker_process import TrackerProcess

    process = TrackerProcess(mlflow_settings(f"sqlite:///{tmp_path / 'mlflow.db'}"))
    yield process
    process.close()


def test_a_run_tracked_through_the_process_holds_params_metrics_artifacts_and_its_status(tmp_path, tracker):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    checkpoint = run_dir / "ckpt-1.index"
    checkpoint.write_bytes(b"weights")
    run_id = tracker.start(str(run_dir), {"batch": 64, "strategy.devices": None}, tags={"job_number": "3"})
    assert (run_dir / RUN_ID_FILE).read_text().strip() == run_id == tracker.run_id
    assert tracker.tracking_uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker.on_epoch_end(_Epoch(1, 0.9))
    tracker.on_epoch_end(_Epoch(2, 0.5))
    tracker.log_metrics({"train_loss": 0.9}, step=1)  # an epoch logged before a resume is not logged again
    tracker.on_checkpoint_saved(2, [str(checkpoint)])
    tracker.log_text("batch: 64\n", "config.yaml")
    assert tracker.metric_histories() == {"train_loss": [(1, 0.9), (2, 0.5)]}
    tracker.finish(ZeroDivisionError("the loss was divided by zero"))
    tracker.close()  # handed over without waiting: delivered by the time the process has ended
    assert not (run_dir / "mlflow_journal.jsonl").exists()  # everything delivered, nothing left to replay

    client = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.data.params == {"batch": "64", "strategy.devices": "None"}
    assert run.data.tags["job_number"] == "3"
    assert metric_history(client, run_id, "train_loss") == [(1, 0.9), (2, 0.5)]
    assert {a.path for a in client.list_artifacts(run_id)} == {"checkpoints", "config.yaml"}
    assert run.info.status == "FAILED"
    assert run.data.tags["error"] == "ZeroDivisionError: the loss was divided by zero"


@pytest.mark.parametrize(
    "choice,logged",
    [("last", ["ckpt-2.index"]), ("all", ["ckpt-1.data", "ckpt-1.index", "ckpt-2.data", "ckpt-2.index"]), ("none", [])],
)
def test_the_checkpoints_a_run_ends_with_follow_mlflow_checkpoints(tmp_path, choice, logged):
    """last: only the newest checkpoint, journaled when the run ends (here KILLED and resumable), without the
    files rotated away by then; all: each save as it comes (journaled: it stays when rotated away); none: nothing."""
    from runner.tracking.tracker_process import TrackerProcess

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = TrackerProcess(
        mlflow_settings(uri, f"mlflow.checkpoints={choice}", "mlflow.system_metrics.enabled=false")
    )
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        files = {name: run_dir / name for name in ("ckpt-1.index", "ckpt-1.data", "ckpt-2.index", "ckpt-2.data")}
        for path in files.values():
            path.write_bytes(b"weights")
        run_id = tracker.start(str(run_dir), {"batch": 64})
        tracker.on_checkpoint_saved(1, [str(files["ckpt-1.data"]), str(files["ckpt-1.index"])])
        if choice == "all":
            tracker.metric_histories()  # waits until the save is delivered: its files may go now
        for name in ("ckpt-1.index", "ckpt-1.data"):
            files[name].unlink()  # rotated away
        tracker.on_checkpoint_saved(2, [str(files["ckpt-2.data"]), str(files["ckpt-2.index"])])
        if choice == "all":
            tracker.metric_histories()
        files["ckpt-2.data"].unlink()  # gone before the run ends
        tracker.finish(RuntimeError("preempted"), resumable=True)
    finally:
        tracker.close()
    client = mlflow_client(uri)
    assert client.get_run(run_id).info.status == "KILLED"
    top = {item.path for item in client.list_artifacts(run_id)}
    assert sorted(item.path.split("/")[-1] for item in client.list_artifacts(run_id, "checkpoints")) == logged
    assert ("checkpoints" in top) == bool(logged)


def test_an_error_in_the_child_is_raised_where_the_call_was_made(tmp_path, tracker):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tracker.start(str(run_dir), {"batch": 64})
    tracker.finish(KeyboardInterrupt(), resumable=True)  # how a preempted run ends: KILLED and resumable
    with pytest.raises(RunnerError, match=r"started with another configuration: batch=128 \(the run has 64\)"):
        tracker.start(str(run_dir), {"batch": 128})
    run = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(tracker.run_id)
    assert run.info.status == "KILLED" and run.data.tags["resumable"] == "true"  # the refused start touched nothing


def test_nothing_is_created_before_the_first_call_and_close_ends_the_child(tmp_path, tracker):
    # Until the child has started and waits for its first call on its pipe: it has imported MLflow, and opened a
    # store, were it to open one before that call.
    wait_for(settled(tracker.pid), 120, "the tracker child to wait for its first call", every=0.1)
    assert not (tmp_path / "mlflow.db").exists()
    child = tracker.pid
    assert is_running(child)
    tracker.close()
    assert not is_running(child)


def test_the_training_process_never_imports_mlflow():
    code = (
        "import sys, runner.train, runner.tracking.tracker_process, runner.clusters.roles; "
        "print(sorted(m for m in ('mlflow', 'sqlalchemy', 'alembic') if m in sys.modules))"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "[]"


# Each process, MLflow imported, waits at the start line (appended to this), then opens the fresh store and tracks
# a run in it.
_IMPORTED = """
import sys
from runner.tracking.store import open_client
"""
_OPEN = """
client = open_client(sys.argv[1])
experiment = client.get_experiment_by_name("together") or client.get_experiment(client.create_experiment("together"))
client.set_terminated(client.create_run(experiment.experiment_id).info.run_id)
"""


@pytest.mark.slow
def test_processes_opening_a_fresh_sqlite_store_together_all_succeed(tmp_path):
    """MLflow migrates a new sqlite file in the first process that opens it; open_client makes the others wait."""
    uri, line = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}", StartLine(tmp_path / "start")
    code = _IMPORTED + line.code() + _OPEN
    processes = [
        subprocess.Popen([sys.executable, "-c", code, uri], stderr=subprocess.PIPE, text=True) for _ in range(4)
    ]
    try:
        line.go(processes)  # once all four have imported MLflow and wait at the line
        errors = [process.communicate(timeout=120)[1] for process in processes]
    finally:
        for process in processes:
            process.kill()
    assert [process.returncode for process in processes] == [0] * 4, "\n".join(errors)[-3000:]
    client = mlflow_client(uri)
    runs = client.search_runs([client.get_experiment_by_name("together").experiment_id])
    assert len(runs) == 4 and {run.info.status for run in runs} == {"FINISHED"}


def test_runs_with_one_seed_get_different_names_and_the_seeded_sequence_goes_on(tmp_path):
    """A chief tracks in its own, seeded process: the name MLflow draws for a run must not follow from the seed,
    and drawing it must not move the seeded sequence the training goes on with."""
    import random

    from runner.tracking.mlflow_tracker import MlflowTracker

    settings = mlflow_settings(f"sqlite:///{tmp_path / 'mlflow.db'}", "mlflow.system_metrics.enabled=false")
    names, draws = [], []
    for index in range(3):
        random.seed(42)
        tracker = MlflowTracker(settings)
        run_dir = tmp_path / f"run{index}"
        run_dir.mkdir()
        run_id = tracker.start(str(run_dir), {"batch": 64})
        draws.append(random.random())
        tracker.finish()
        names.append(mlflow_client(settings.tracking_uri).get_run(run_id).info.run_name)
    assert len(set(names)) == 3, names
    random.seed(42)
    assert draws == [random.random()] * 3


def test_a_spare_tracker_started_ahead_tracks_the_next_run_and_ends_with_its_owner(tmp_path):
    """A warm sweep worker starts its next run's tracker child while it waits (start_spare): the next TrackerProcess
    takes that child, which has imported MLflow already, hands it its settings and tracks as usual; a spare nobody took
    ends when discarded."""
    from runner.tracking.tracker_process import TrackerProcess, discard_spare, start_spare

    start_spare()
    from runner.tracking import tracker_process

    [(spare, _)] = tracker_process._spare
    tracker = TrackerProcess(mlflow_settings(f"sqlite:///{tmp_path / 'mlflow.db'}"))
    try:
        assert tracker.pid == spare.pid and not tracker_process._spare
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        run_id = tracker.start(str(run_dir), {"batch": 64})
        tracker.on_epoch_end(_Epoch(1, 0.7))
        assert tracker.metric_histories() == {"train_loss": [(1, 0.7)]}
        tracker.finish(None)
    finally:
        tracker.close()
    assert mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id).info.status == "FINISHED"
    start_spare()
    [(unused, _)] = tracker_process._spare
    discard_spare()
    assert not tracker_process._spare and not is_running(unused.pid)

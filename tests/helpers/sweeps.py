"""Sweeps as a user starts them (`python -m runner -m ...` in a fresh process) and the runs they leave in
`sqlite:///<tmp_path>/mlflow.db`: one parent run, one child per job, a summary."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from helpers.presets import SWEEP_JOB
from helpers.processes import live_members, wait_group
from helpers.turns import alone_now
from helpers.waiting import exited, wait_for
from runner import outcome
from runner.metric_table import DEFAULT_TABLE
from runner.outcome import FINISHED, OUTCOME_FILE
from runner.run_lock import LOCK_FILE
from runner.sweeps.report.report import GENERATED_PREFIX
from runner.sweeps.report.summary import CSV_FILE, CURVES_FILE, JOBS_CSV_FILE, JOBS_MARKDOWN_FILE, MARKDOWN_FILE
from runner.sweeps.terms import PARENT_RUN_ID_FILE
from runner.tracking.run_id_file import RUN_ID_FILE


def sweep_command(tmp_path, sweep_dir, overrides):
    return [
        sys.executable,
        "-m",
        "runner",
        "-m",
        *SWEEP_JOB,
        f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        f"hydra.sweep.dir={sweep_dir}",
        *overrides,
    ]


def start_sweep(tmp_path, sweep_dir, overrides) -> subprocess.Popen:
    """The sweep, started in a session of its own: its process group holds its jobs and their training processes."""
    return subprocess.Popen(
        sweep_command(tmp_path, sweep_dir, overrides),
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_until_training(process: subprocess.Popen, log: Path, what: str, timeout: float = 240) -> None:
    """Until the run that logs to `log` has started training (its "steps per epoch" line)."""
    wait_for(
        lambda: log.exists() and "steps per epoch" in log.read_text(),
        timeout,
        f"{what} to start training",
        unless=exited(process, "the sweep"),
    )


def freeze_training(process: subprocess.Popen, run_dir: Path, what: str) -> int:
    """Once the training process of `run_dir` trains (its "steps per epoch" line), stop it where it is (SIGSTOP);
    return its pid, read from the run directory's lock, which it holds."""
    wait_until_training(process, run_dir / "runner.log", what)
    pid = int((run_dir / LOCK_FILE).read_text().strip())
    os.kill(pid, signal.SIGSTOP)
    return pid


def killed_while_frozen(tmp_path, sweep_dir, overrides, job: str) -> tuple[subprocess.Popen, int]:
    """Start the sweep, freeze job `job`'s training process once it trains (SIGSTOP), and kill -9 the sweep's own
    process alone, as a closed terminal or `kill -9 <its pid>` does: what it started is left running. Returns the
    killed sweep (its process group holds what is left) and the frozen training process's pid."""
    process = start_sweep(tmp_path, sweep_dir, overrides)
    try:
        frozen = freeze_training(process, sweep_dir / job, f"trial {job}")
    except BaseException:
        if live_members(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
        raise
    process.kill()
    process.wait()
    return process, frozen


def left_running_then_stopped(process: subprocess.Popen, frozen: int) -> float:
    """Let the frozen orphan go on (SIGCONT): it finds its sweep gone and stops; within 20 s nothing the killed
    sweep started is alive. Returns how long that took. Timed while no other test runs (alone_now)."""
    assert live_members(process.pid), "the kill of the sweep's process alone left nothing running"
    try:
        with alone_now():
            started = time.monotonic()
            os.kill(frozen, signal.SIGCONT)
            assert wait_group(process, 20), f"processes {live_members(process.pid)} outlived their sweep"
            return time.monotonic() - started
    finally:  # whatever failed (the wait, or the turn), nothing the test started outlives it
        os.killpg(process.pid, signal.SIGKILL) if live_members(process.pid) else None


def kill_sweep_while_training(tmp_path, sweep_dir, overrides, log: Path, what: str) -> None:
    """Start a sweep and kill -9 all of it (the sweep, its jobs, their training processes) once the run that logs
    to `log` trains."""
    process = start_sweep(tmp_path, sweep_dir, overrides)
    try:
        wait_until_training(process, log, what)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def sweep(tmp_path, sweep_dir, *overrides) -> subprocess.CompletedProcess:
    return subprocess.run(
        sweep_command(tmp_path, sweep_dir, overrides), cwd=tmp_path, capture_output=True, text=True, timeout=300
    )


def client_for(tmp_path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")


def all_runs(client):
    return client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)


def children(client, parent_id):
    runs = [run for run in all_runs(client) if run.data.tags.get(MLFLOW_PARENT_RUN_ID) == parent_id]
    return sorted(runs, key=lambda run: int(run.data.tags["job_number"]))


def parent_id_of(sweep_dir) -> str:
    return (sweep_dir / PARENT_RUN_ID_FILE).read_text().strip()


def summary_rows(sweep_dir, name=JOBS_CSV_FILE):
    """The per-job table (name=CSV_FILE: the per-configuration one)."""
    with open(sweep_dir / name) as handle:
        return list(csv.DictReader(handle))


def without_generated_line(report: str) -> str:
    """A sweep report without the one line that differs between two reports of the same runs."""
    return "\n".join(line for line in report.splitlines() if not line.startswith(GENERATED_PREFIX))


def job_overrides(*swept):
    """The `overrides` tag a job gets: Hydra lists the command's fixed overrides in the given order and
    puts the swept ones where their sweep was on the command line (last, here)."""
    return ",".join([*SWEEP_JOB, "mlflow.tracking_uri=sqlite\\:///{db}", *swept])


def assert_finished_sweep(tmp_path, sweep_dir, result, points, launcher="basic"):
    """One parent, one FINISHED child per point with the right tags, metrics and summary row."""
    assert result.returncode == 0, result.stderr[-3000:]
    client = client_for(tmp_path)
    parent_id = parent_id_of(sweep_dir)
    parents = [run for run in all_runs(client) if MLFLOW_PARENT_RUN_ID not in run.data.tags]
    assert [run.info.run_id for run in parents] == [parent_id]
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED"
    assert parent.info.run_name == "sweep"  # the sweep directory, relative to where the command ran

    jobs = children(client, parent_id)
    assert [run.data.tags["job_number"] for run in jobs] == [str(n) for n in range(len(points))]
    db = f"{tmp_path}/mlflow.db"
    for number, (run, point) in enumerate(zip(jobs, points, strict=True)):
        assert run.info.status == "FINISHED"
        assert run.data.tags["overrides"] == job_overrides(*point).format(db=db)
        assert run.info.run_name == ",".join(point)
        assert run.data.tags["launcher"] == launcher
        job_dir = sweep_dir / str(number)
        assert (job_dir / RUN_ID_FILE).read_text().strip() == run.info.run_id
        ended = outcome.read(str(job_dir / OUTCOME_FILE), 0)
        assert ended.status == FINISHED and ended.run_id == run.info.run_id
        for key in DEFAULT_TABLE.result_keys:
            if key.startswith("val_") and key not in ended.metrics:  # no validation split: no val_ metrics
                continue
            if key == "model_bytes":  # logged with the model, after the outcome (and these jobs log none)
                continue
            assert run.data.metrics[key] == pytest.approx(ended.metrics[key])
        assert 0.0 <= run.data.metrics["test_accuracy"] <= 1.0
        assert run.data.metrics["train_loss"] > 0
        # One epoch, logged once: no lost and no duplicated metric.
        assert [m.step for m in client.get_metric_history(run.info.run_id, "test_accuracy")] == [1]

    rows = summary_rows(sweep_dir)
    assert [row["job"] for row in rows] == [str(n) for n in range(len(points))]
    for row, run, point in zip(rows, jobs, points, strict=True):
        assert row["overrides"] == ",".join(point)
        assert row["status"] == "FINISHED"
        assert row["run_id"] == run.info.run_id
        assert float(row["test_accuracy"]) == pytest.approx(run.data.metrics["test_accuracy"])
        assert float(row["wall_seconds"]) > 1.0
    artifacts = {info.path for info in client.list_artifacts(parent_id)}
    assert {CSV_FILE, MARKDOWN_FILE, JOBS_CSV_FILE, JOBS_MARKDOWN_FILE, CURVES_FILE} <= artifacts
    markdown = (sweep_dir / MARKDOWN_FILE).read_text()
    assert markdown in result.stdout  # the table printed at the end is the logged one
    assert sum(line.startswith("| ") for line in markdown.splitlines()) == 1 + len(points)
    best = max(jobs, key=lambda run: run.data.metrics["test_accuracy"])
    assert f"best test_accuracy: {best.data.metrics['test_accuracy']:.4f}" in markdown
    assert parent.data.metrics["best_test_accuracy"] == pytest.approx(best.data.metrics["test_accuracy"])
    return parent_id, jobs


class StandInLauncher:
    """Hydra's launch, standing in for a sweep's jobs in the sweeper's own tests: each trial's job number and overrides
    are recorded and it answers at once, FAILED for the trials `fails` picks (as a job whose training failed
    answers), else with a value made from the overrides (the same configuration, the same value: as the same seed
    trains)."""

    def __init__(self, fails=lambda overrides: False, answer=None):
        import threading

        self.fails = fails
        self.answer = answer  # the value (or values, one per objective) for a trial's overrides; None: as above
        self.launched: list[tuple[int, tuple[str, ...]]] = []
        self.lock = threading.Lock()

    def launch(self, job_overrides, initial_job_idx: int):
        from hydra.core.utils import JobReturn, JobStatus

        returns = []
        for offset, overrides in enumerate(job_overrides):
            with self.lock:
                self.launched.append((initial_job_idx + offset, tuple(overrides)))
            if self.fails(overrides):
                error = RuntimeError("the job's training failed")
                returns.append(JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=error))
            else:
                value = self.answer(overrides) if self.answer else (sum(map(ord, "".join(overrides))) % 97) / 97
                returns.append(JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED, _return_value=value))
        return returns

"""Sweeps end to end: real `python -m runner -m ...` processes, a real MLflow sqlite store in tmp_path.

Every job trains the real model on tiny synthetic data for one epoch, so a job takes about ten seconds.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time

import pytest
import yaml

from helpers.cli import run_cli
from helpers.presets import SWEEP_JOB
from helpers.processes import children as child_processes
from helpers.sweeps import (
    all_runs,
    assert_finished_sweep,
    children,
    client_for,
    kill_sweep_while_training,
    parent_id_of,
    start_sweep,
    summary_rows,
    sweep,
    sweep_command,
    wait_until_training,
)
from runner import outcome
from runner.outcome import OUTCOME_FILE

pytestmark = pytest.mark.slow

GRID = [
    ("batch=32", "lr_scaling=none"),
    ("batch=32", "lr_scaling=linear"),
    ("batch=64", "lr_scaling=none"),
    ("batch=64", "lr_scaling=linear"),
]


def start_and_kill_during_job(tmp_path, sweep_dir, overrides, job: int) -> None:
    """Run a sweep and kill it all (Hydra's process and the training process) while `job` trains."""
    kill_sweep_while_training(tmp_path, sweep_dir, overrides, sweep_dir / str(job) / "runner.log", f"job {job}")


@pytest.fixture(scope="module")
def serial_sweep(tmp_path_factory):
    """A 4-job serial sweep, killed while job 2 trains, then run again to completion in the same
    directory (one sweep's worth of training serves the serial, interrupted and re-run tests)."""
    tmp_path = tmp_path_factory.mktemp("serial")
    sweep_dir = tmp_path / "sweep"
    overrides = ("batch=32,64", "lr_scaling=none,linear")
    start_and_kill_during_job(tmp_path, sweep_dir, overrides, job=2)
    client = client_for(tmp_path)
    parent_id = parent_id_of(sweep_dir)
    interrupted = children(client, parent_id)
    interrupted_parent_status = client.get_run(parent_id).info.status
    completed = sweep(tmp_path, sweep_dir, *overrides)
    return tmp_path, sweep_dir, overrides, parent_id, interrupted, interrupted_parent_status, completed


def test_serial_sweep_has_one_parent_four_children_and_a_summary(serial_sweep):
    tmp_path, sweep_dir, _, _, _, _, result = serial_sweep
    assert_finished_sweep(tmp_path, sweep_dir, result, GRID)
    assert "4 jobs, 4 finished, 0 failed" in result.stdout
    # SWEEP_JOB's mlflow.log_model=false: the jobs logged no model, and the sweep registered none.
    client = client_for(tmp_path)
    experiment_id = client.get_experiment_by_name("fashion_mnist").experiment_id
    assert client.search_logged_models([experiment_id]) == []
    assert client.search_registered_models() == []
    assert "registered_model_version" not in client.get_run(parent_id_of(sweep_dir)).data.tags


def test_an_interrupted_sweep_completes_the_rest_under_the_same_parent(serial_sweep):
    tmp_path, sweep_dir, _, parent_id, interrupted, parent_status, result = serial_sweep
    # What the kill left: jobs 0 and 1 done, job 2's run still RUNNING, no job 3, the parent open.
    assert [run.info.status for run in interrupted] == ["FINISHED", "FINISHED", "RUNNING"]
    assert parent_status == "RUNNING"

    assert parent_id_of(sweep_dir) == parent_id
    completed = children(client_for(tmp_path), parent_id)
    # Jobs 0 and 1 were skipped, job 2 continued the run it had when it was killed, job 3 is new.
    assert [run.info.run_id for run in completed[:3]] == [run.info.run_id for run in interrupted]
    assert result.stdout.count("already FINISHED") == 2
    assert f"job 2 (batch=64,lr_scaling=none): continuing MLflow run {interrupted[2].info.run_id}" in result.stdout
    assert [run.info.status for run in completed] == ["FINISHED"] * 4


@pytest.mark.alone  # a rerun that trains nothing takes under 30 s
def test_rerun_of_a_finished_sweep_trains_nothing(serial_sweep):
    tmp_path, sweep_dir, overrides, _, _, _, _ = serial_sweep
    client = client_for(tmp_path)
    before = sorted(run.info.run_id for run in all_runs(client))

    started = time.monotonic()
    again = sweep(tmp_path, sweep_dir, *overrides)
    elapsed = time.monotonic() - started

    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(run.info.run_id for run in all_runs(client)) == before
    assert again.stdout.count("already FINISHED") == 4
    assert "MLflow run" not in again.stdout.replace("already FINISHED as MLflow run", "")
    assert elapsed < 30  # no training process was started (one alone needs ~10 s)
    assert_finished_sweep(tmp_path, sweep_dir, again, GRID)


def test_joblib_sweep_runs_jobs_in_parallel_under_one_parent(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = sweep(
        tmp_path, sweep_dir, "batch=32,64", "lr_scaling=none,linear", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"
    )
    assert "Joblib.Parallel(n_jobs=2" in result.stdout
    parent_id, jobs = assert_finished_sweep(tmp_path, sweep_dir, result, GRID, launcher="joblib")
    # The jobs really overlapped: each started before another one ended.
    spans = sorted((run.info.start_time, run.info.end_time) for run in jobs)
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:], strict=False))


def test_the_launcher_tag_names_the_launcher_and_slurm_jobs_are_named_as_slurm_shows_them():
    from runner.sweeps.job.job import other_task_rank, slurm_job_id
    from runner.sweeps.launch.launchers import launcher_name

    assert launcher_name("hydra._internal.core_plugins.basic_launcher.BasicLauncher") == "basic"
    assert launcher_name("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher") == "joblib"
    assert launcher_name("hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher") == "submitit_slurm"
    assert launcher_name("hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher") == "submitit_local"
    assert launcher_name("hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher") == "ray"
    assert launcher_name("my_plugins.queue.RQLauncher") == "rq"
    assert slurm_job_id({"SLURM_JOB_ID": "17", "SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "3"}) == "12_3"
    assert slurm_job_id({"SLURM_JOB_ID": "17"}) == "17"
    assert slurm_job_id({}) is None
    # In a job of several SLURM tasks only task 0 records the job; the others train beside it.
    assert other_task_rank({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1"}) == 1
    assert other_task_rank({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"}) is None
    assert other_task_rank({"SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}) is None
    assert other_task_rank({}) is None


def test_a_failing_job_is_recorded_and_the_others_finish(tmp_path):
    sweep_dir = tmp_path / "sweep"
    # resume=never too: a job's run directory already holds the run id its sweep created, which is not an
    # earlier run to refuse.
    result = sweep(tmp_path, sweep_dir, "resume=never", "batch=32,0")

    assert result.returncode != 0
    assert "1 of 2 sweep jobs failed: job 1 (batch=0)" in result.stderr
    assert "batch=0 is not valid" in result.stderr
    client = client_for(tmp_path)
    parent_id = parent_id_of(sweep_dir)
    assert client.get_run(parent_id).info.status == "FAILED"
    good, bad = children(client, parent_id)
    assert good.info.status == "FINISHED"
    assert 0.0 <= good.data.metrics["test_accuracy"] <= 1.0
    assert bad.info.status == "FAILED"
    assert bad.data.tags["error"].startswith("batch=0 is not valid")
    assert bad.data.tags["overrides"].endswith(",batch=0")
    rows = summary_rows(sweep_dir)
    assert [(row["job"], row["status"]) for row in rows] == [("0", "FINISHED"), ("1", "FAILED")]
    assert rows[1]["test_accuracy"] == ""
    assert rows[1]["error"].startswith("batch=0 is not valid")
    assert "| 1 | batch=0 | FAILED |" in result.stdout


def test_optuna_sweep_reports_the_best_trial(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = sweep(tmp_path, sweep_dir, "hparams_search=optuna", "hydra.sweeper.n_trials=3")

    assert result.returncode == 0, result.stderr[-3000:]
    client = client_for(tmp_path)
    parent_id = parent_id_of(sweep_dir)
    trials = children(client, parent_id)
    assert len(trials) == 3 and all(run.info.status == "FINISHED" for run in trials)
    for run in trials:
        # Each trial's run is named by the values optuna picked for the search space.
        names = sorted(item.split("=")[0] for item in run.info.run_name.split(","))
        assert names == ["batch", "optimizer.lr"]
        assert float(run.data.params["optimizer.lr"]) == pytest.approx(
            float(run.info.run_name.split("optimizer.lr=")[1].split(",")[0])
        )
    best = max(trials, key=lambda run: run.data.metrics["test_accuracy"])
    reported = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert reported["best_value"] == pytest.approx(best.data.metrics["test_accuracy"])
    assert f"Best value: {reported['best_value']}" in result.stdout
    assert client.get_run(parent_id).data.metrics["best_test_accuracy"] == pytest.approx(reported["best_value"])
    assert len(summary_rows(sweep_dir)) == 3
    assert not math.isinf(reported["best_value"])


def test_a_jobs_paragraph_reaches_its_run_from_the_outcome_file_with_stderr_gone(tmp_path):
    """The sweep's stderr, and so its training processes', goes nowhere: the child run still gets the exact
    paragraph the training process ended with, which it read from that process's outcome file."""
    sweep_dir = tmp_path / "sweep"
    done = subprocess.run(
        sweep_command(tmp_path, sweep_dir, ("resume=never", "batch=0")),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0, done.stdout[-3000:]
    # The paragraph a user sees when the same job runs on its own.
    alone = run_cli(*SWEEP_JOB, "batch=0", f"hydra.run.dir={tmp_path / 'alone'}", cwd=tmp_path)
    paragraph = alone.stderr.strip().splitlines()[-1]
    assert alone.returncode == 2 and paragraph.startswith("error: batch=0 is not valid"), alone.stderr[-3000:]
    [run] = children(client_for(tmp_path), parent_id_of(sweep_dir))
    assert run.info.status == "FAILED"
    assert run.data.tags["error"] == paragraph.removeprefix("error: ")
    ended = outcome.read(str(sweep_dir / "0" / OUTCOME_FILE), None)
    assert (ended.status, ended.exit_code, ended.paragraph) == ("FAILED", 2, paragraph)


def test_a_training_process_killed_outright_fails_its_job_as_one_that_wrote_no_outcome(tmp_path):
    sweep_dir = tmp_path / "sweep"
    # A fresh process per run (tests/test_warm_workers.py kills a warm worker the same way).
    process = start_sweep(tmp_path, sweep_dir, ("epochs=50", "sweep.warm_workers=false"))
    try:
        wait_until_training(process, sweep_dir / "0" / "runner.log", "its job")
        [training] = [pid for pid in child_processes(process.pid) if "hydra.mode=RUN" in _command_line(pid)]
        os.kill(training, signal.SIGKILL)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode != 0
    [run] = children(client_for(tmp_path), parent_id_of(sweep_dir))
    assert run.info.status == "FAILED"
    assert run.data.tags["error"] == (
        f"the training process was killed by SIGKILL and wrote no outcome ({sweep_dir / '0' / OUTCOME_FILE}): it "
        "was killed, or died before it could say why."
    )


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""

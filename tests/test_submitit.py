"""Sweeps through hydra-submitit-launcher: `hydra/launcher=submitit_slurm` against a real one-node SLURM that
this module starts (tests/helpers/slurm.py), and `hydra/launcher=submitit_local` without one.

The SLURM has no accounting, so submitit's sacct calls fail: the sweep must still end, from the jobs'
result files and `scontrol show job`, also when SLURM kills a job before it wrote its result.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from helpers.config import REPO
from helpers.presets import SWEEP_JOB
from helpers.processes import children as child_processes
from helpers.processes import find_process
from helpers.requires import requires
from helpers.slurm import free_port_run, running_slurm
from helpers.sweeps import (
    all_runs,
    assert_finished_sweep,
    children,
    client_for,
    killed_while_frozen,
    left_running_then_stopped,
    parent_id_of,
    summary_rows,
    sweep,
    sweep_command,
)
from helpers.waiting import exited, wait_for
from runner.clusters.local import free_ports
from runner.tracking.run_id_file import RUN_ID_FILE

pytestmark = pytest.mark.slow

ON_SLURM = ["hydra/launcher=submitit_slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1"]
POINTS = [("batch=32",), ("batch=64",)]


@pytest.fixture(scope="module")
def slurm():
    with running_slurm() as cluster:
        yield cluster


def _submitit_process(array_task: str) -> int:
    """The pid of the process submitit runs the job function in, for one SLURM array task."""
    array_job, index = array_task.split("_")
    pid = find_process({"SLURM_ARRAY_JOB_ID": array_job, "SLURM_ARRAY_TASK_ID": index}, "submitit.core._submit")
    assert pid is not None, f"no submitit process for {array_task}"
    return pid


def _slurm_tags_match_the_jobs(jobs) -> None:
    ids = [run.data.tags["slurm_job_id"] for run in jobs]
    assert all(re.fullmatch(r"\d+_\d+", job_id) for job_id in ids), ids
    assert [job_id.split("_")[1] for job_id in ids] == [str(n) for n in range(len(jobs))]  # one array


@pytest.mark.server
@requires("slurm")
def test_submitit_slurm_sweep_survives_a_killed_job_and_a_rerun_finishes_it(slurm, tmp_path):
    """Each job is a SLURM array task. One is killed outright (as a node failure or the OOM killer would)
    before it wrote a result: without sacct the sweep still ends, with that job FAILED and the other
    FINISHED; the same command again trains only the killed job, into its own run."""
    sweep_dir = tmp_path / "sweep"
    overrides = (*ON_SLURM, "batch=32,64")
    process = subprocess.Popen(
        sweep_command(tmp_path, sweep_dir, overrides),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Job 1 created its child run and started its training process: freeze that process, so that it
        # cannot finish meanwhile, and kill the SLURM task's process outright, as a node failure would
        # (scancel's SIGTERM would let it record its own failure). SLURM then kills what is left of the task.
        sweep_ended = exited(process, "the sweep")
        wait_for(lambda: (sweep_dir / "1" / "mlflow_run_id.txt").exists(), 240, "job 1's run", unless=sweep_ended)
        array_tasks = slurm.run("squeue", "-h", "-r", "-o", "%i").stdout.split()
        [job_1] = [task for task in array_tasks if task.endswith("_1")]
        task_process = _submitit_process(job_1)
        wait_for(lambda: child_processes(task_process), 240, "job 1's training process", unless=sweep_ended)
        [training] = child_processes(task_process)
        os.kill(training, signal.SIGSTOP)
        os.kill(task_process, signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode != 0, stderr[-3000:]
    assert "1 of 2 sweep jobs failed: job 1 (batch=64)" in stderr, stderr[-3000:]
    assert f"SLURM job {job_1} of job 1 stopped before the job finished" in stderr
    client = client_for(tmp_path)
    parent_id = parent_id_of(sweep_dir)
    first, killed = children(client, parent_id)
    assert (first.info.status, killed.info.status) == ("FINISHED", "FAILED")
    assert killed.data.tags["error"].startswith(f"SLURM job {job_1} of job 1 stopped before the job finished")
    assert "Fix:" in killed.data.tags["error"] and f"hydra.sweep.dir={sweep_dir}" in killed.data.tags["error"]
    assert killed.data.tags["slurm_job_id"] == job_1
    assert [(row["job"], row["status"]) for row in summary_rows(sweep_dir)] == [("0", "FINISHED"), ("1", "FAILED")]

    again = sweep(tmp_path, sweep_dir, *overrides)
    # Each job logs on its node, into its job directory: job 0 skipped itself, job 1 continued its run.
    assert "already FINISHED" in (sweep_dir / "0" / "runner.log").read_text()
    assert f"continuing MLflow run {killed.info.run_id}" in (sweep_dir / "1" / "runner.log").read_text()
    _, jobs = assert_finished_sweep(tmp_path, sweep_dir, again, POINTS, launcher="submitit_slurm")
    assert [run.info.run_id for run in jobs] == [first.info.run_id, killed.info.run_id]
    _slurm_tags_match_the_jobs(jobs)
    assert (sweep_dir / ".submitit").is_dir()  # each SLURM job's script and logs


@pytest.mark.server
@requires("slurm")
def test_a_job_at_its_time_limit_saves_ends_failed_and_the_sweep_ends(slurm, tmp_path):
    """hydra.launcher.timeout_min=2: submitit's time-out signal (signal_delay_s before the limit) reaches a job
    still training. The training process is stopped as preemption stops it (it saves and is resumable), the
    job is FAILED with the time limit named, and the sweep ends instead of waiting or aborting."""
    sweep_dir = tmp_path / "sweep"
    started = time.monotonic()
    result = subprocess.run(
        sweep_command(
            tmp_path,
            sweep_dir,
            (*ON_SLURM, "hydra.launcher.timeout_min=2", "hydra.launcher.signal_delay_s=30", "epochs=100000"),
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode != 0 and time.monotonic() - started < 240, result.stderr[-3000:]
    assert "1 of 1 sweep jobs failed: job 0" in result.stderr, result.stderr[-3000:]
    client = client_for(tmp_path)
    [job] = children(client, parent_id_of(sweep_dir))
    assert job.info.status == "FAILED"
    slurm_job = job.data.tags["slurm_job_id"]
    assert job.data.tags["error"].startswith(
        f"SLURM job {slurm_job} of job 0 stopped before the job finished: it reached its time limit, "
        "hydra.launcher.timeout_min=2"
    ), job.data.tags["error"]
    assert f"hydra.sweep.dir={sweep_dir}" in job.data.tags["error"]
    # The training process saved when told to stop: the run can be continued by a re-run of the sweep.
    assert job.data.tags["resumable"] == "true"
    assert "stopping its training process" in (sweep_dir / "0" / "runner.log").read_text()
    assert list((sweep_dir / "0" / "checkpoints").glob("ckpt-*.index"))
    assert [(row["job"], row["status"]) for row in summary_rows(sweep_dir)] == [("0", "FAILED")]


def test_a_time_limit_shorter_than_the_signal_delay_is_one_paragraph(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "runner", "-m", *ON_SLURM, "hydra.launcher.timeout_min=1", "batch=32"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith(
        "error: hydra.launcher.signal_delay_s=120 is not less than the jobs' time limit, "
        "hydra.launcher.timeout_min=1 (60 s)"
    ), done.stderr
    assert "Fix: lower hydra.launcher.signal_delay_s below 60" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "multirun").exists() and not (tmp_path / "mlflow.db").exists()


@requires("slurm")
def test_a_slurm_without_a_controller_is_one_paragraph_and_a_failed_parent_run(tmp_path):
    """sbatch is installed but no slurmctld answers on the port slurm.conf names: the sweep stops at once with
    sbatch's error and the fix, and its MLflow parent run (created before the launch) ends FAILED, not RUNNING."""
    [port] = free_ports(1)  # nothing listens there
    conf = tmp_path / "slurm.conf"
    # A short MessageTimeout: sbatch gives up on the controller in seconds instead of retrying for a minute.
    conf.write_text(
        f"ClusterName=nocontroller\nSlurmctldHost=localhost\nSlurmctldPort={port}\nAuthType=auth/none\n"
        "CredType=cred/none\nMessageTimeout=2\nNodeName=localhost CPUs=1 State=UNKNOWN\n"
        "PartitionName=debug Nodes=localhost Default=YES State=UP\n"
    )
    sweep_dir = tmp_path / "sweep"
    started = time.monotonic()
    done = subprocess.run(
        sweep_command(tmp_path, sweep_dir, (*ON_SLURM, "batch=32,64")),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SLURM_CONF": str(conf)},
    )
    assert time.monotonic() - started < 60
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith(
        "error: hydra/launcher=submitit_slurm could not submit the sweep's 2 job(s): sbatch said 'sbatch: error: "
        "Batch job submission failed: Unable to contact slurm controller"
    ), done.stderr
    assert "Fix: make sure a SLURM controller answers here (`scontrol ping` says UP" in done.stderr
    assert "hydra/launcher=submitit_local" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    client = client_for(tmp_path)
    parent = client.get_run(parent_id_of(sweep_dir))
    assert parent.info.status == "FAILED"
    assert parent.data.tags["error"] == done.stderr.strip().removeprefix("error: ")
    assert children(client, parent.info.run_id) == []


def test_submitit_local_sweep_runs_the_same_way_without_slurm_and_stops_with_a_killed_sweep(tmp_path):
    """kill -9 of the sweep's process while job 1 trains: the training submitit's local job started stops by itself
    (KILLED, resumable) and nothing of the sweep outlives it; the same command finishes the sweep as one run would."""
    sweep_dir = tmp_path / "sweep"
    overrides = ("hydra/launcher=submitit_local", "batch=32,64")
    process, frozen = killed_while_frozen(tmp_path, sweep_dir, overrides, "1")
    left_running_then_stopped(process, frozen)
    killed = client_for(tmp_path).get_run((sweep_dir / "1" / RUN_ID_FILE).read_text().strip())
    assert killed.info.status == "KILLED" and killed.data.tags["resumable"] == "true"
    result = sweep(tmp_path, sweep_dir, *overrides)
    _, jobs = assert_finished_sweep(tmp_path, sweep_dir, result, POINTS, launcher="submitit_local")
    assert not any("slurm_job_id" in run.data.tags for run in jobs)
    assert jobs[1].info.run_id == killed.info.run_id  # continued


@pytest.mark.server
@requires("slurm")
def test_a_sweep_of_two_task_multi_worker_mirrored_jobs_has_one_child_per_job_and_fold(slurm, tmp_path):
    """hydra.launcher.tasks_per_node=2: every job is a 2-task MultiWorkerMirrored cluster; task 0 records it, one
    child run per fold (sweep.folds=2: both tasks train fold 0, then fold 1, as one cluster each time)."""
    sweep_dir = tmp_path / "sweep"
    single = [item for item in SWEEP_JOB if not item.startswith("strategy=")]
    command = [
        sys.executable,
        "-m",
        "runner",
        "-m",
        *single,
        f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        f"hydra.sweep.dir={sweep_dir}",
        *ON_SLURM,
        "hydra.launcher.tasks_per_node=2",
        # Two jobs on one node would share ports: one at a time.
        "hydra.launcher.array_parallelism=1",
        f"cluster.port_base={free_port_run(2)}",
        "strategy=multi_worker_mirrored",
        "cluster=slurm",
        "batch=32,64",
        "sweep.folds=2",
    ]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    client = client_for(tmp_path)
    parent_id = parent_id_of(sweep_dir)
    assert len(all_runs(client)) == 5  # the parent and one child per job and fold, not per task
    runs = sorted(children(client, parent_id), key=lambda run: run.info.run_name)
    assert [run.info.run_name for run in runs] == [
        "batch=32,fold=0",
        "batch=32,fold=1",
        "batch=64,fold=0",
        "batch=64,fold=1",
    ]
    jobs = [run for run in runs if run.data.tags["fold"] == "0"]
    for run in runs:
        assert run.info.status == "FINISHED"
        assert (run.data.params["num_replicas"], run.data.params["cluster.kind"]) == ("2", "slurm")
        assert run.data.tags["launcher"] == "submitit_slurm"
        assert 0.0 <= run.data.metrics["test_accuracy"] <= 1.0
    _slurm_tags_match_the_jobs(jobs)
    assert "4 jobs, 4 finished, 0 failed" in result.stdout


def test_missing_sbatch_and_missing_extra_are_one_paragraph(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    no_sbatch = subprocess.run(
        [sys.executable, "-m", "runner", "-m", "hydra/launcher=submitit_slurm", "batch=32,64"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": str(empty), "PYTHONPATH": str(REPO)},
    )
    # Without the package: its import blocked, as on a machine where the extra was never installed.
    no_extra = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy, sys; sys.modules['hydra_plugins.hydra_submitit_launcher'] = None; "
            "sys.argv = ['runner', '-m', 'hydra/launcher=submitit_local', 'batch=32,64']; "
            "runpy.run_module('runner', run_name='__main__')",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    for done, start, fix in (
        (
            no_sbatch,
            "error: hydra/launcher=submitit_slurm submits every job with sbatch, which is not on the PATH",
            "hydra/launcher=submitit_local",
        ),
        (
            no_extra,
            "error: hydra/launcher=submitit_local needs the optional extra 'slurm', which is not installed",
            "pip install -e '.[slurm]'",
        ),
    ):
        assert done.returncode == 2, done.stderr[-3000:]
        assert done.stderr.startswith(start) and fix in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "multirun").exists() and not (tmp_path / "mlflow.db").exists()

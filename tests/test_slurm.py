"""Training under a real SLURM: the shipped sbatch scripts (slurm/*.sbatch), submitted with sbatch to a
one-node slurmctld + slurmd that this module starts (tests/helpers/slurm.py), each task a real `python -m runner`.

Without accounting there is no sacct: a job's end state is read with `scontrol show job` (ended jobs stay
visible for the test SLURM's MinJobAge).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest

from helpers.cluster import assert_losses_match_two_mirrored_replicas
from helpers.presets import TWO_EPOCHS
from helpers.processes import find_process
from helpers.requires import requires
from helpers.slurm import (
    MULTI_WORKER,
    PARAMETER_SERVER,
    free_port_run,
    job_output,
    running_slurm,
    start_now_once_pending,
    submit,
    wait_for_checkpoint,
)
from helpers.tracking import metric_history, only_run
from helpers.waiting import wait_for
from runner import outcome

pytestmark = [pytest.mark.slow, pytest.mark.server, requires("slurm")]


@pytest.fixture(scope="module")
def slurm():
    with running_slurm() as cluster:
        yield cluster


def _task_pid(job: str, rank: int, timeout: float = 120) -> int:
    """The pid of task `rank` of the job's step: the `python -m runner` srun started."""
    return wait_for(
        lambda: find_process({"SLURM_JOB_ID": job, "SLURM_PROCID": str(rank), "SLURM_STEP_ID": "0"}, "runner"),
        timeout,
        f"task {rank} of job {job}",
        every=0.2,
    )


def test_multi_worker_mirrored_job_matches_two_mirrored_replicas(slurm, tmp_path):
    job = submit(slurm, tmp_path, MULTI_WORKER, 2, "batch=32")
    state = slurm.wait_job(job)
    output = job_output(tmp_path, MULTI_WORKER, job)
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), output[-3000:]
    client, run = only_run(tmp_path)  # one MLflow run for the job, from the chief (task 0)
    assert run.info.status == "FINISHED"
    assert run.info.run_id == (tmp_path / "run" / "mlflow_run_id.txt").read_text().strip()
    assert (run.data.params["num_replicas"], run.data.params["global_batch_size"]) == ("2", "64")
    for key in ("train_loss", "test_accuracy"):
        assert [step for step, _ in metric_history(client, run.info.run_id, key)] == [1, 2], key
    assert {"checkpoints", "curves.png", "config.yaml"} <= {f.path for f in client.list_artifacts(run.info.run_id)}
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("*.index")) == ["ckpt-16.index"]
    assert "worker 1 of the cluster: training in step with the chief" in output

    assert_losses_match_two_mirrored_replicas(client, run.info.run_id, tmp_path, "SLURM multi_worker_mirrored")


def test_parameter_server_job_preempted_by_scancel_resumes_and_completes(slurm, tmp_path):
    """SIGTERM to every task (what preemption sends): the chief saves and marks its run KILLED, the servers
    end with it. The same script submitted again resumes that run; once the chief is done, the servers end
    by themselves and the job is COMPLETED."""
    run_dir = tmp_path / "run"
    overrides = ("epochs=4", "checkpoint.every_epochs=1", "batch=32", f"cluster.port_base={free_port_run(3)}")
    first = submit(slurm, tmp_path, PARAMETER_SERVER, 3, *overrides, RUNNER_STEPS_PER_EPOCH="150")
    wait_for_checkpoint(run_dir, slurm, first)
    slurm.run("scancel", "--signal=TERM", first)
    state = slurm.wait_job(first, timeout=120)
    output = job_output(tmp_path, PARAMETER_SERVER, first)
    assert state["JobState"] == "FAILED", (state, output[-3000:])  # the tasks exited 143: preempted
    client, run = only_run(tmp_path)
    assert run.info.status == "KILLED", output[-3000:]
    assert run.data.tags["resumable"] == "true"
    assert "preempted: stopped by SIGTERM after saving" in output
    assert "the chief is done (preempted): ps 0 ends with status 143" in output
    assert "the chief is done (preempted): worker 0 ends with status 143" in output
    trained = len(metric_history(client, run.info.run_id, "train_loss"))
    assert 1 <= trained < 4

    second = submit(slurm, tmp_path, PARAMETER_SERVER, 3, *overrides, RUNNER_STEPS_PER_EPOCH="150")
    state = slurm.wait_job(second)
    output = job_output(tmp_path, PARAMETER_SERVER, second)
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), output[-3000:]
    assert "resuming after epoch" in output
    assert "the chief is done (finished): ps 0 ends with status 0" in output
    assert "the chief is done (finished): worker 0 ends with status 0" in output
    client, resumed = only_run(tmp_path)  # the same run, continued
    assert resumed.info.run_id == run.info.run_id and resumed.info.status == "FINISHED"
    for key in ("train_loss", "test_accuracy", "examples_per_second"):
        assert [step for step, _ in metric_history(client, run.info.run_id, key)] == [1, 2, 3, 4], key
    assert resumed.data.params["loop.steps_per_epoch"] == "150"
    assert resumed.data.metrics["eval_accuracy"] == pytest.approx(resumed.data.metrics["test_accuracy"], abs=1e-6)
    assert "checkpoints" in {f.path for f in client.list_artifacts(run.info.run_id)}
    assert list((run_dir / "checkpoints").glob("ckpt-*.index"))


def test_a_requeued_job_resumes_by_itself_into_the_same_run(slurm, tmp_path):
    """The scripts ask for `#SBATCH --requeue`: a job SLURM requeues (preemption, a node failure; here
    `scontrol requeue`) runs again under the same job id, so in the same run directory, and resumes the same
    MLflow run from its checkpoint, with nobody submitting anything."""
    job = submit(slurm, tmp_path, MULTI_WORKER, 2, "epochs=8", "checkpoint.every_epochs=1")
    wait_for_checkpoint(tmp_path / "run", slurm, job)
    slurm.run("scontrol", "requeue", job)
    start_now_once_pending(slurm, job)
    state = slurm.wait_job(job)
    output = job_output(tmp_path, MULTI_WORKER, job)
    assert (state["JobState"], state["ExitCode"], state["Restarts"]) == ("COMPLETED", "0:0", "1"), output[-3000:]
    # --open-mode=append: the requeued run's output follows the first run's.
    assert output.count(f"runner: job {job}, 2 tasks") == 2, output[-3000:]
    # SLURM's requeue signals the tasks: they stop together at one step, so the resume may start mid-epoch.
    assert re.search(
        r"^0: .*resuming after epoch \d+( and \d+ step\(s\) of the next epoch)? from ", output, re.MULTILINE
    ), output[-3000:]
    client, run = only_run(tmp_path)  # the same run, continued, not a second one
    assert run.info.status == "FINISHED"
    assert [step for step, _ in metric_history(client, run.info.run_id, "train_loss")] == list(range(1, 9))
    assert run.data.metrics["eval_accuracy"] == pytest.approx(run.data.metrics["test_accuracy"], abs=1e-6)


@pytest.mark.alone  # the job must fail within 60 s of the kill, and must not have ended before it
def test_a_killed_task_fails_the_job_within_a_minute_with_the_chiefs_paragraph(slurm, tmp_path):
    # A run directory the script must quote for Hydra: a quote, a comma (a sweep to Hydra), spaces, a `$`.
    run_dir = tmp_path / "it's a run, for $HOME"
    job = submit(slurm, tmp_path, MULTI_WORKER, 2, "epochs=30", run_dir=run_dir)
    wait_for_checkpoint(run_dir, slurm, job)
    os.kill(_task_pid(job, 1), signal.SIGKILL)
    killed = time.monotonic()
    state = slurm.wait_job(job, timeout=120)
    elapsed = time.monotonic() - killed
    output = job_output(tmp_path, MULTI_WORKER, job)
    assert state["JobState"] == "FAILED" and elapsed < 60, (state, elapsed, output[-3000:])
    errors = [line for line in output.splitlines() if re.match(r"\d+: error: ", line)]  # a task's, not srun's
    assert len(errors) == 1, errors
    [error] = errors
    assert error.startswith("0: error: another task of the cluster failed or stopped answering during epoch "), error
    assert "/job:worker/replica:0/task:1" in error and "Fix:" in error
    assert f"hydra.run.dir={run_dir}" in error
    # Each task of the job step says how it ended in a file of its own; the killed one could not.
    ended = outcome.read(str(run_dir / "outcome-worker-0.json"), None)
    assert (ended.status, ended.exit_code, ended.paragraph) == ("FAILED", 2, error.removeprefix("0: "))
    assert not (run_dir / "outcome-worker-1.json").exists()
    client, run = only_run(tmp_path)
    assert run.info.status == "FAILED" and "stopped answering" in run.data.tags["error"]


def test_more_slurm_tasks_than_a_one_process_strategy_can_use_is_one_paragraph(slurm, tmp_path):
    done = slurm.run(
        "srun",
        "--ntasks=2",
        "--cpus-per-task=1",
        sys.executable,
        "-m",
        "runner",
        *TWO_EPOCHS,
        "strategy=one_device",
        f"hydra.run.dir={tmp_path / 'run'}",
        check=False,
        cwd=tmp_path,
        timeout=120,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(errors) == 2, done.stderr[-3000:]
    # Both tasks stop with one paragraph: this one, or, for a task that came second to the shared run
    # directory, the paragraph saying another process holds it.
    ours = [
        error
        for error in errors
        if error.startswith(
            "error: this SLURM job step runs 2 tasks, but strategy=one_device with cluster=none trains in one process"
        )
    ]
    assert ours and all(error in ours or "is in use by another runner process" in error for error in errors), errors
    assert "Fix: start one task (srun --ntasks=1" in ours[0] and "strategy=multi_worker_mirrored" in ours[0]
    assert "Traceback" not in done.stderr and not (tmp_path / "mlflow.db").exists()

"""A preempted MultiWorkerMirrored task, wherever the cluster comes from: SIGTERM to the chief of a TF_CONFIG
cluster, `scancel --signal=TERM` and a time limit under a real SLURM, and a deterministic run that is preempted
and resumed ending bit for bit where the uninterrupted one does.

Every worker stops at the step they agreed on, the chief saves it, every task exits with the preemption status
(143), the MLflow run is KILLED and resumable, and starting the same tasks again finishes that run with each
epoch logged once. Real processes throughout: the tasks talk gRPC, SLURM is a real slurmctld and slurmd.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from helpers.preemption import (
    Task,
    any_alive,
    assert_worker_words,
    checkpoints,
    chief_stop,
    cluster_tasks,
    latest_checkpoint,
    model_weights,
)
from helpers.presets import TINY
from helpers.requires import requires
from helpers.tracking import metric_history, mlflow_client
from helpers.waiting import wait_for
from runner import outcome

pytestmark = pytest.mark.slow

PREEMPTED = 128 + signal.SIGTERM
# Metrics that do not depend on the clock: the same in a resumed run as in an uninterrupted one, to the bit.
EXACT_METRICS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "learning_rate")


def _run_id(run_dir: Path) -> str:
    return (run_dir / "mlflow_run_id.txt").read_text().strip()


def _local_cluster(tmp_path: Path, name: str, *overrides: str) -> Task:
    return Task(
        *overrides,
        "strategy=multi_worker_mirrored",
        "cluster=local",
        "cluster.workers=2",
        "mlflow.tracking_uri=sqlite:///mlflow.db",
        f"hydra.run.dir={tmp_path / name}",
        cwd=tmp_path,
    )


def test_deterministic_multi_worker_mirrored_run_preempted_and_resumed_is_bit_identical(tmp_path):
    """runtime.deterministic=true, two workers: SIGTERM to worker 1 mid-epoch, then the same command again.
    Every epoch's metrics and the final weights equal the uninterrupted run's to the bit: the resume skips
    exactly the batches each worker's shard had consumed, and the preempted epoch's sums carry on. Early stopping
    that no epoch after the first can satisfy stops both runs after epoch 2 of 3: the resumed one only if the
    checkpoint kept its state (lost, epoch 2 would be its first best and it would train epoch 3)."""
    args = (
        *TINY,
        "dataset.train_examples=8192",
        "batch=32",
        "epochs=3",
        "checkpoint.every_epochs=1",
        "runtime.deterministic=true",
        "seed=5",
        "early_stopping.patience=1",
        "early_stopping.monitor=train_loss",
        "early_stopping.min_delta=100",
    )
    reference = _local_cluster(tmp_path, "reference", *args)
    output = reference.finish(timeout=600)
    assert reference.process.returncode == 0, output[-3000:]

    run_dir = tmp_path / "run"
    first = _local_cluster(tmp_path, "run", *args)
    try:
        first.wait_for("epoch 1/3")
        tasks = cluster_tasks(first.process.pid)
        assert sorted(tasks) == ["worker 0", "worker 1"]
        # Epoch 1's checkpoint is written after its line, and epoch 2 starts once it is: the signal lands in epoch 2
        # (TensorFlow's handler takes it, and the workers stop at a step boundary of epoch 2 they agree on).
        first.wait_until(lambda: checkpoints(run_dir), "epoch 1's checkpoint (epoch 2 starts after it)")
        signal_sent = time.monotonic()
        os.kill(tasks["worker 1"], signal.SIGTERM)
        output = first.finish(timeout=120)
    finally:
        first.stop()
    assert first.process.returncode == PREEMPTED and "Traceback" not in output, output[-3000:]
    print(f"the workers stopped {time.monotonic() - signal_sent:.1f} s after the SIGTERM")
    step = chief_stop(output, "worker 1")
    assert (run_dir / "checkpoints" / f"ckpt-{step}.index").exists()
    assert_worker_words((run_dir / "tasks" / "worker-1.log").read_text(), "worker 1", step, run_dir / "checkpoints")
    assert not any_alive(tasks.values())
    # The launcher's outcome is its chief's: KILLED and resumable, with the paragraph it ended with.
    ended = outcome.read(str(run_dir / "outcome.json"), None)
    [words] = [line for line in output.splitlines() if line.startswith("preempted: stopped at global step")]
    assert (ended.status, ended.resumable, ended.paragraph) == ("KILLED", True, words)
    client = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    stopped = client.get_run(_run_id(run_dir))
    assert stopped.info.status == "KILLED" and stopped.data.tags["resumable"] == "true"

    again = _local_cluster(tmp_path, "run", *args)
    output = again.finish(timeout=600)
    assert again.process.returncode == 0, output[-3000:]
    # The stop was mid-epoch: the resume continues the epoch it stopped in.
    assert re.search(rf"resuming after epoch \d and \d+ step\(s\) of the next epoch from .*ckpt-{step}", output), (
        output[-3000:]
    )

    resumed, uninterrupted = _run_id(run_dir), _run_id(tmp_path / "reference")
    assert client.get_run(resumed).info.status == "FINISHED"
    tags = [client.get_run(run_id).data.tags for run_id in (resumed, uninterrupted)]
    assert [(each["best_epoch"], each["stopped_at_epoch"]) for each in tags] == [("1", "2")] * 2
    for key in EXACT_METRICS:
        history = metric_history(client, resumed, key)
        # Step 3 of an epoch metric is epoch 1's logged again (keep_best, on with early stopping), not an epoch.
        assert [epoch for epoch, _ in history] == ([1, 2] if key == "learning_rate" else [1, 2, 3]), (key, history)
        assert history == metric_history(client, uninterrupted, key), key
    final, expected = latest_checkpoint(run_dir), latest_checkpoint(tmp_path / "reference")
    assert final.name == expected.name
    weights = model_weights(final)
    assert weights and weights == model_weights(expected)


def _tf_config_cluster(tmp_path: Path, workers: list[str], *overrides: str) -> list[Task]:
    """Every task of a hand-made TF_CONFIG cluster, as a Kubernetes operator starts them: the same command,
    TF_CONFIG saying which worker each is (worker 0 is the chief)."""
    return [
        Task(
            *overrides,
            "strategy=multi_worker_mirrored",
            "cluster=tf_config",
            "mlflow.tracking_uri=sqlite:///mlflow.db",
            f"hydra.run.dir={tmp_path / 'run'}",
            cwd=tmp_path,
            env={"TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})},
        )
        for index in range(len(workers))
    ]


def test_sigterm_to_the_chief_of_a_tf_config_cluster_stops_every_worker_and_the_rerun_finishes(tmp_path):
    """The preempted VM is the chief's: SIGTERM to worker 0 of a TF_CONFIG cluster alone. Both workers stop at
    the step they agreed on, the chief saves it and marks the run KILLED and resumable, both exit 143, and the
    same two commands again finish the run with each epoch logged once."""
    from runner.clusters.local import free_ports

    workers = [f"localhost:{port}" for port in free_ports(2)]
    args = (*TINY, "dataset.train_examples=8192", "batch=32", "epochs=3", "checkpoint.every_epochs=1")
    run_dir = tmp_path / "run"
    tasks = _tf_config_cluster(tmp_path, workers, *args)
    chief = tasks[0]
    try:
        chief.wait_for("epoch 1/3")
        chief.wait_until(lambda: checkpoints(run_dir), "epoch 1's checkpoint (epoch 2 starts after it)")
        chief.process.send_signal(signal.SIGTERM)
        outputs = [task.finish(timeout=120) for task in tasks]
    finally:
        for task in tasks:
            task.stop()
    assert [task.process.returncode for task in tasks] == [PREEMPTED, PREEMPTED], [out[-2000:] for out in outputs]
    assert not any("Traceback" in out for out in outputs), outputs[1][-3000:]
    step = chief_stop(outputs[0], "worker 0")
    assert (run_dir / "checkpoints" / f"ckpt-{step}.index").exists()
    assert_worker_words(outputs[1], "worker 1", step, run_dir / "checkpoints", "worker 0")
    client = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(_run_id(run_dir))
    assert run.info.status == "KILLED" and run.data.tags["resumable"] == "true"
    trained = [epoch for epoch, _ in metric_history(client, run.info.run_id, "train_loss")]
    assert trained in ([1], [1, 2]), trained

    tasks = _tf_config_cluster(tmp_path, workers, *args)
    try:
        outputs = [task.finish(timeout=300) for task in tasks]
    finally:
        for task in tasks:
            task.stop()
    assert [task.process.returncode for task in tasks] == [0, 0], [out[-2000:] for out in outputs]
    assert re.search(rf"resuming after epoch \d( and \d+ step\(s\) of the next epoch)? from .*ckpt-{step}", outputs[0])
    assert _run_id(run_dir) == run.info.run_id
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED"
    for key in ("train_loss", "test_accuracy"):
        assert [epoch for epoch, _ in metric_history(client, run.info.run_id, key)] == [1, 2, 3], key


@pytest.fixture(scope="module")
def slurm():
    from helpers.slurm import running_slurm

    with running_slurm() as cluster:
        yield cluster


def _assert_both_tasks_preempted(output: str, run_dir: Path) -> int:
    """Both tasks of the job's step ended with the preemption status after their words; the agreed step."""
    step = chief_stop(output)
    assert_worker_words(output, "worker 1", step, run_dir / "checkpoints")
    for task in (0, 1):
        assert f"srun: error: localhost: task {task}: Exited with exit code 143" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    return step


@pytest.mark.server
@requires("slurm")
def test_scancel_signal_term_stops_a_multi_worker_job_at_one_step_and_the_resubmitted_job_finishes(slurm, tmp_path):
    """`scancel --signal=TERM` (what a user or a site's preemption sends): every task of the 2-task
    MultiWorkerMirrored job stops at the agreed step after the chief's checkpoint and exits 143, the run is
    KILLED and resumable; the same script submitted again resumes it and the job is COMPLETED."""
    from helpers.slurm import MULTI_WORKER, free_port_run, job_output, submit, wait_for_checkpoint

    run_dir = tmp_path / "run"
    args = ("dataset.train_examples=8192", "batch=32", "epochs=3", "checkpoint.every_epochs=1")
    args = (*args, f"cluster.port_base={free_port_run(2)}")
    first = submit(slurm, tmp_path, MULTI_WORKER, 2, *args)
    wait_for_checkpoint(run_dir, slurm, first)  # epoch 1 is done: the signal lands in epoch 2
    slurm.run("scancel", "--signal=TERM", first)
    state = slurm.wait_job(first, timeout=120)
    output = job_output(tmp_path, MULTI_WORKER, first)
    assert (state["JobState"], state["ExitCode"]) == ("FAILED", "143:0"), (state, output[-3000:])
    step = _assert_both_tasks_preempted(output, run_dir)
    assert (run_dir / "checkpoints" / f"ckpt-{step}.index").exists()
    client = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(_run_id(run_dir))
    assert run.info.status == "KILLED" and run.data.tags["resumable"] == "true"

    second = submit(slurm, tmp_path, MULTI_WORKER, 2, *args)
    state = slurm.wait_job(second)
    output = job_output(tmp_path, MULTI_WORKER, second)
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), output[-3000:]
    assert re.search(
        rf"^0: .*resuming after epoch \d( and \d+ step\(s\) of the next epoch)? from .*ckpt-{step}$", output, re.M
    )
    assert _run_id(run_dir) == run.info.run_id
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    for key in ("train_loss", "test_accuracy"):
        assert [epoch for epoch, _ in metric_history(client, run.info.run_id, key)] == [1, 2, 3], key


@pytest.mark.server
@requires("slurm")
def test_a_job_signalled_before_its_time_limit_saves_requeues_itself_and_finishes_the_run(slurm, tmp_path):
    """`sbatch --time=2 --signal=TERM@60`: SLURM sends SIGTERM to every task 60 s before the time limit (up to
    30 s later: its check runs every 30 s), after the tasks' first steps (about 30 s after they start here). The
    tasks stop together after the chief's checkpoint and, with RUNNER_REQUEUE=1, the script requeues the job,
    which resumes under the same job id into the same MLflow run and finishes it."""
    from helpers.slurm import MULTI_WORKER, job_ended, job_output, start_now_once_pending, submit

    run_dir = tmp_path / "run"
    # Longer than the 60-90 s before the signal, at the speed of an idle machine (about 2.5 s an epoch; twice that
    # on a busy one, where the requeued job then trains for a few minutes).
    epochs = 30
    job = submit(
        slurm,
        tmp_path,
        MULTI_WORKER,
        2,
        "dataset.train_examples=8192",
        "batch=32",
        f"epochs={epochs}",
        "checkpoint.every_epochs=5",
        options=("--time=2", "--signal=TERM@60"),
        RUNNER_REQUEUE="1",
    )
    requeued = f"runner: job {job} was preempted after its checkpoint; requeueing it (RUNNER_REQUEUE=1)"
    wait_for(
        lambda: requeued in job_output(tmp_path, MULTI_WORKER, job),
        240,
        f"job {job} to requeue itself",
        every=0.5,
        unless=job_ended(slurm, job),
        detail=lambda: job_output(tmp_path, MULTI_WORKER, job)[-3000:],
    )
    # Requeued, the job waits out SLURM's BeginTime; start it now, with the time the rest of the run needs.
    start_now_once_pending(slurm, job, "TimeLimit=10")
    state = slurm.wait_job(job, timeout=600)
    output = job_output(tmp_path, MULTI_WORKER, job)
    assert (state["JobState"], state["ExitCode"], state["Restarts"]) == ("COMPLETED", "0:0", "1"), (
        slurm.logs(),
        state,
        output[-3000:],
    )
    step = _assert_both_tasks_preempted(output, run_dir)
    assert re.search(
        rf"^0: .*resuming after epoch \d+( and \d+ step\(s\) of the next epoch)? from .*ckpt-{step}$", output, re.M
    )
    client = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.run_id == _run_id(run_dir) and run.info.status == "FINISHED"
    for key in ("train_loss", "test_accuracy"):
        assert [epoch for epoch, _ in metric_history(client, run.info.run_id, key)] == list(range(1, epochs + 1)), key

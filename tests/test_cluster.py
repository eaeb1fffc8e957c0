"""Multi-process clusters on localhost: real `python -m runner` processes forming TensorFlow clusters.

MultiWorkerMirrored and ParameterServer through cluster=local (the runner starts and watches every
task), a bad TF_CONFIG, and a task killed mid-run. Nothing is mocked; the tasks talk gRPC.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.cluster import assert_losses_match_two_mirrored_replicas, train_losses
from helpers.config import compose
from helpers.preemption import Task, checkpoints, cluster_tasks
from helpers.presets import TWO_EPOCHS, WITH_MODEL
from helpers.processes import is_running
from helpers.tracking import metric_history, only_run
from helpers.waiting import exited, wait_for
from runner import outcome
from runner.config.settings import validate
from runner.errors import RunnerError


def _settings(*overrides: str):
    from omegaconf import OmegaConf

    return validate(OmegaConf.to_container(compose(list(overrides)), resolve=True))


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _cli(tmp_path: Path, name: str, *overrides: str, **env: str) -> subprocess.CompletedProcess:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "runner",
            *TWO_EPOCHS,
            f"mlflow.tracking_uri={uri}",
            f"hydra.run.dir={tmp_path / name}",
            *overrides,
        ],
        cwd=tmp_path,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _models(client, run) -> list[str]:
    """The ids of the models the run logged (a finished chief logs one)."""
    return [
        model.model_id
        for model in client.search_logged_models([run.info.experiment_id])
        if model.source_run_id == run.info.run_id
    ]


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if text.encode() in handle.read():
                        found.append(int(entry))
            except OSError:
                continue
    return [pid for pid in found if is_running(pid)]


class _Launcher(Task):
    """`python -m runner ... cluster=local` in the background, its output (logs on stdout, the error
    paragraph on stderr) read as it comes."""

    def __init__(self, tmp_path: Path, *overrides: str):
        self.run_dir = tmp_path / "run"
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        super().__init__(
            *TWO_EPOCHS,
            f"mlflow.tracking_uri={uri}",
            f"hydra.run.dir={self.run_dir}",
            "cluster=local",
            *overrides,
            cwd=tmp_path,
        )


# -- configuration and TF_CONFIG checks, in this process ----------------------------------------------------------


@pytest.mark.parametrize(
    "overrides,named,hint",
    [
        (["strategy=multi_worker_mirrored"], "cluster='none'", "cluster=local"),
        (["strategy=parameter_server", "loop.steps_per_epoch=5"], "cluster='none'", "cluster=local"),
        (["strategy=mirrored", "cluster=local"], "cluster='local'", "strategy=multi_worker_mirrored"),
        (["strategy=parameter_server", "cluster=local"], "loop.steps_per_epoch=None", "loop.steps_per_epoch=50"),
        (["strategy=mirrored", "strategy.communication=ring"], "strategy.communication='ring'", "multi_worker"),
        (
            ["strategy=multi_worker_mirrored", "cluster=local", "strategy.variable_partitioner.max_shards=2"],
            "strategy.variable_partitioner.max_shards=2",
            "strategy=parameter_server",
        ),
        (["strategy=multi_worker_mirrored", "cluster=local", "cluster.workers=0"], "cluster.workers=0", "workers=2"),
    ],
)
def test_cluster_settings_refuse_what_cannot_run(overrides, named, hint):
    with pytest.raises(RunnerError) as raised:
        _settings(*overrides)
    message = str(raised.value)
    assert message.startswith(f"{named} is not valid"), message
    assert hint in message and "Fix:" in message and "\n" not in message


def test_cluster_options_compose():
    settings = _settings(
        "strategy=parameter_server",
        "cluster=local",
        "cluster.workers=3",
        "cluster.ps=2",
        "loop.steps_per_epoch=50",
        "strategy.variable_partitioner.max_shards=2",
    )
    assert (settings.cluster.kind, settings.cluster.workers, settings.cluster.ps) == ("local", 3, 2)
    assert settings.strategy.variable_partitioner.max_shards == 2
    assert settings.strategy.variable_partitioner.min_shard_bytes == 256 << 10
    for kind in ("tf_config", "slurm"):
        assert _settings("strategy=multi_worker_mirrored", f"cluster={kind}").cluster.kind == kind
    assert _settings().cluster.kind == "none" and _settings().strategy.communication == "auto"
    # No all-reduce timeout unless asked for: each timed all-reduce holds a thread for the whole timeout.
    assert _settings("strategy=multi_worker_mirrored", "cluster=local").cluster.timeout_seconds is None
    assert (
        _settings(
            "strategy=multi_worker_mirrored", "cluster=local", "cluster.timeout_seconds=60"
        ).cluster.timeout_seconds
        == 60.0
    )
    with pytest.raises(RunnerError, match=r"cluster.timeout_seconds=0 is not valid.*Fix: .*or null"):
        _settings("strategy=multi_worker_mirrored", "cluster=local", "cluster.timeout_seconds=0")


@pytest.mark.parametrize(
    "tf_config,strategy,problem",
    [
        ('{"cluster": {"worker": ["localhost:1"]', "multi_worker_mirrored", "is not valid JSON"),
        ('["worker"]', "multi_worker_mirrored", 'needs a "cluster" object'),
        (
            '{"cluster": {"worker": ["localhost:1"], "ps": ["localhost:2"]}, "task": {"type": "worker", "index": 0}}',
            "multi_worker_mirrored",
            "has a 'ps' job",
        ),
        (
            '{"cluster": {"worker": ["localhost:1"], "ps": ["localhost:2"]}, "task": {"type": "worker", "index": 0}}',
            "parameter_server",
            "has no chief task",
        ),
        (
            '{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 3}}',
            "multi_worker_mirrored",
            "does not have",
        ),
        (
            '{"cluster": {"worker": ["localhost"]}, "task": {"type": "worker", "index": 0}}',
            "multi_worker_mirrored",
            "host:port",
        ),
    ],
)
def test_bad_tf_config_is_named_with_the_fix(tf_config, strategy, problem):
    from runner.clusters.roles import read_tf_config

    with pytest.raises(RunnerError) as raised:
        read_tf_config(tf_config, strategy)
    message = str(raised.value)
    assert problem in message and "Fix:" in message and "\n" not in message, message


def test_tf_config_roles():
    from runner.clusters.roles import is_chief, read_tf_config
    from runner.clusters.serving import serves as _serves

    spec = {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]}
    config = read_tf_config(json.dumps({"cluster": spec, "task": {"type": "chief", "index": 0}}), "parameter_server")
    assert config["task"] == {"type": "chief", "index": 0}
    assert is_chief(spec, "chief", 0) and not is_chief(spec, "worker", 0)
    assert is_chief({"worker": ["h:1", "h:2"]}, "worker", 0) and not is_chief({"worker": ["h:1"]}, "worker", 1)
    assert _serves("ps", "parameter_server") and _serves("worker", "parameter_server")
    assert not _serves("worker", "multi_worker_mirrored") and not _serves("chief", "parameter_server")


def test_slurm_step_resolves_roles_on_cpu_nodes(monkeypatch):
    """TensorFlow's SlurmClusterResolver, fed a SLURM job step of 4 tasks on two nodes (no nvidia-smi)."""
    from runner.clusters.roles import resolve

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for name, value in {
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NODELIST": "node[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    }.items():
        monkeypatch.setenv(name, value)
    settings = _settings(
        "strategy=parameter_server", "cluster=slurm", "loop.steps_per_epoch=5", "cluster.port_base=9000"
    )
    roles = []
    for rank in range(4):
        monkeypatch.setenv("SLURM_PROCID", str(rank))
        task = resolve(settings)
        roles.append((task.type, task.index, task.chief))
    assert roles == [("chief", 0, True), ("ps", 0, False), ("worker", 0, False), ("worker", 1, False)]
    assert task.resolver.cluster_spec().as_dict() == {
        "chief": ["node1:9000"],
        "ps": ["node1:9001"],
        "worker": ["node2:9000", "node2:9001"],
    }
    assert task.resolver.num_accelerators() == {}
    monkeypatch.delenv("SLURM_PROCID")
    with pytest.raises(RunnerError, match=r"cluster=slurm could not read the SLURM job step .*Fix: start every task"):
        resolve(settings)


def _exiting_task(tmp_path: Path, type_: str, index: int, code: str):
    """A real process standing in for a cluster task: it runs `code` and ends as that code says. Its output
    goes nowhere a launcher reads: what it says of its end is in its outcome file."""
    from runner.clusters.local import _Task

    log_path = None if type_ == "chief" else str(tmp_path / f"{type_}-{index}.log")
    task = _Task(type_, index, "{}", log_path, str(tmp_path / f"outcome-{type_}-{index}.json"))
    output = open(log_path, "w") if log_path else subprocess.DEVNULL
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "RUNNER_OUTCOME_FILE": task.outcome_file}
    task.process = subprocess.Popen([sys.executable, "-c", code], stdout=output, stderr=subprocess.STDOUT, env=env)
    task.started = time.monotonic()
    if log_path:
        output.close()
    return task


_KILLED = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
# A task that fails after {delay} s. The delay is a sleep on purpose: the launcher (_watch) must find the other task
# ended while this one still runs, and no event of _watch's tells a test that it has looked.
_FAILING = (
    "import os, sys, time; from runner import outcome; time.sleep({delay}); "
    "outcome.write(os.environ['RUNNER_OUTCOME_FILE'], outcome.Outcome('FAILED', 2, 'error: {said}')); sys.exit(2)"
)
_LOST_PEER = _FAILING.replace("{said}", "another task of the cluster failed")
_MISTAKE_SAID = "strategy.communication=nccl is not valid"
_MISTAKE = _FAILING.replace("{said}", _MISTAKE_SAID).format(delay=0)


@pytest.mark.parametrize("chief_delay", [1.0, 0.0], ids=["launcher-sees-the-worker-first", "chief-ends-first"])
def test_the_launcher_blames_the_killed_task_not_the_chief_that_lost_it(tmp_path, chief_delay):
    """The chief stops with status 2 and its own paragraph when a peer dies; whichever the launcher sees
    first, the job's error names the task that was killed, and that it wrote no outcome."""
    from runner.clusters.local import _watch

    chief = _exiting_task(tmp_path, "chief", 0, _LOST_PEER.format(delay=chief_delay))
    worker = _exiting_task(tmp_path, "worker", 1, _KILLED)
    if not chief_delay:  # both are gone before the launcher looks: it sees the chief's status first
        chief.process.wait()
        worker.process.wait()
    ended, error = _watch([chief, worker], None, str(tmp_path))
    assert ended.exit_code == 2
    assert error is not None and error.startswith("worker 1 of the local cluster (pid "), error
    assert "killed by SIGKILL" in error and f"Its log: {tmp_path / 'worker-1.log'}" in error
    assert f"and wrote no outcome ({worker.outcome_file})" in error, error


def test_a_mistake_every_task_made_is_left_to_the_chief_to_explain(tmp_path):
    from runner.clusters.local import _watch

    chief = _exiting_task(tmp_path, "chief", 0, _MISTAKE)
    worker = _exiting_task(tmp_path, "worker", 1, _MISTAKE)
    chief.process.wait()
    worker.process.wait()
    ended, error = _watch([chief, worker], None, str(tmp_path))
    # The chief's paragraph comes from its outcome file alone: its output went to /dev/null.
    assert (ended.status, ended.exit_code, error) == ("FAILED", 2, None)
    assert ended.paragraph == "error: strategy.communication=nccl is not valid"
    # The worker's mistake seen first (the chief sleeps a second: _FAILING): the launcher waits for the chief's own
    # paragraph.
    chief = _exiting_task(tmp_path, "chief", 0, _FAILING.replace("{said}", _MISTAKE_SAID).format(delay=1))
    worker = _exiting_task(tmp_path, "worker", 1, _MISTAKE)
    ended, error = _watch([chief, worker], None, str(tmp_path))
    assert (ended.exit_code, ended.paragraph, error) == (2, "error: strategy.communication=nccl is not valid", None)


def test_a_chief_killed_by_a_signal_is_the_one_named(tmp_path):
    from runner.clusters.local import _watch

    chief = _exiting_task(tmp_path, "chief", 0, _KILLED)
    worker = _exiting_task(tmp_path, "worker", 1, _LOST_PEER.format(delay=0))
    chief.process.wait()
    worker.process.wait()
    ended, error = _watch([chief, worker], None, str(tmp_path))
    assert ended.exit_code == -9 and error.startswith("chief 0 (the chief) of the local cluster"), error
    assert "was killed by SIGKILL and wrote no outcome" in error, error


def test_a_lost_peer_paragraph_keeps_tensorflows_cause_not_the_stack_of_the_graph_node():
    """An all-reduce aborted inside a tf.function raises "Graph execution error" with the Python stack that
    built the node first: the paragraph must still name the task TensorFlow says stopped answering."""
    import tensorflow as tf

    from runner.clusters.roles import Task
    from runner.training.run_ending import _peer_failure

    cause = "The following tasks are unhealthy (stopped sending heartbeats): /job:worker/replica:0/task:1"

    def deep(x, depth):  # a long stack of Python frames above the node, as the runner's own has
        return deep(x, depth - 1) if depth else tf.debugging.check_numerics(x, cause)

    @tf.function
    def step(x):
        return deep(x, 30)

    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        step(tf.constant(float("nan")))
    assert raised.value.message.startswith("Graph execution error:")  # TensorFlow's format, stack first
    assert raised.value.message.index(cause) > 400
    error = _peer_failure(raised.value, Task("worker", 0, True), 3, "/runs/r/checkpoints/ckpt-32", "/runs/r")
    message = str(error)
    assert "/job:worker/replica:0/task:1" in message and "Detected at node" not in message, message
    assert message.startswith("another task of the cluster failed or stopped answering during epoch 3, so worker 0")
    assert "the checkpoints up to /runs/r/checkpoints/ckpt-32 are kept" in message and "\n" not in message


# -- real clusters ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_bad_tf_config_and_a_cluster_without_chief_exit_with_one_paragraph(tmp_path):
    malformed = _cli(
        tmp_path,
        "malformed",
        "strategy=multi_worker_mirrored",
        "cluster=tf_config",
        TF_CONFIG='{"cluster": {"worker": ["localhost:2222"]}, "task": ',
    )
    no_chief = _cli(
        tmp_path,
        "no-chief",
        "strategy=parameter_server",
        "cluster=tf_config",
        "loop.steps_per_epoch=5",
        TF_CONFIG=json.dumps(
            {
                "cluster": {"worker": ["localhost:2222"], "ps": ["localhost:2223"]},
                "task": {"type": "worker", "index": 0},
            }
        ),
    )
    for done, start in ((malformed, "error: TF_CONFIG is not valid JSON"), (no_chief, "error: TF_CONFIG's cluster {")):
        assert done.returncode == 2, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
        assert done.stderr.strip().startswith(start), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert "has no chief task: strategy=parameter_server needs the coordinator" in no_chief.stderr
    assert not (tmp_path / "mlflow.db").exists()  # nothing was tracked for a job that never started


@pytest.mark.slow
def test_two_worker_multi_worker_mirrored_matches_two_mirrored_replicas_and_both_stop_early_together(tmp_path):
    """Two processes of batch 32 all-reducing over gRPC do the maths of two in-process replicas of 32. With early
    stopping that no epoch after the first can satisfy (train_loss must fall by 100), both workers stop after
    epoch 2 of 3, the job ends FINISHED, and the model evaluated and logged is epoch 1's (checkpoint.keep_best)."""
    scratch = tmp_path / "tmp"  # the job's own temporary directory: where the non-chief's scratch saves go
    scratch.mkdir()
    done = _cli(
        tmp_path,
        "mwms",
        "strategy=multi_worker_mirrored",
        "cluster=local",
        "cluster.workers=2",
        "batch=32",
        WITH_MODEL,
        "epochs=3",
        "early_stopping.patience=1",
        "early_stopping.monitor=train_loss",
        "early_stopping.min_delta=100",
        TMPDIR=str(scratch),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    client, run = only_run(tmp_path)  # one MLflow run for the job, from the chief
    assert run.info.status == "FINISHED"
    assert len(_models(client, run)) == 1  # the chief's trained model
    assert run.info.run_id == (tmp_path / "mwms" / "mlflow_run_id.txt").read_text().strip()
    assert (run.data.params["num_replicas"], run.data.params["global_batch_size"]) == ("2", "64")
    assert [step for step, _ in metric_history(client, run.info.run_id, "examples_per_second")] == [1, 2]
    assert (run.data.tags["best_epoch"], run.data.tags["stopped_at_epoch"]) == ("1", "2")
    # keep_best (on with early stopping): epoch 1's metrics logged again at step 3, the run's latest values.
    assert run.data.tags["best_metrics_step"] == "3"
    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
        history = metric_history(client, run.info.run_id, key)
        assert [step for step, _ in history] == [1, 2, 3] and history[2][1] == history[0][1], key
    worker = (tmp_path / "mwms" / "tasks" / "worker-1.log").read_text()
    assert "epoch 2/3: " in worker and "epoch 3/3" not in worker  # it stopped with the chief
    epoch_1_accuracy = metric_history(client, run.info.run_id, "test_accuracy")[0][1]
    assert run.data.metrics["eval_accuracy"] == pytest.approx(epoch_1_accuracy, abs=1e-6)
    artifacts = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert {"checkpoints", "curves.png", "config.yaml"} <= artifacts
    # Worker 1 saved its checkpoints into temporary directories, removed again: only the chief's are kept.
    assert sorted(p.name for p in (tmp_path / "mwms" / "checkpoints").glob("*.index")) == ["ckpt-16.index"]
    assert not [name for name in os.listdir(scratch) if name.startswith("runner-ckpt-")]
    assert (tmp_path / "mwms" / "tasks" / "worker-1.log").exists()

    assert_losses_match_two_mirrored_replicas(client, run.info.run_id, tmp_path, "multi_worker_mirrored")


@pytest.mark.slow
def test_parameter_server_trains_survives_a_worker_dying_checkpoints_and_stops_early(tmp_path):
    """2 workers and 1 ps, variables split in two shards; worker 1 is killed mid-run and restarted. Early stopping
    that no epoch after the first can satisfy (train_loss must fall by 100, patience 2) stops the coordinator after
    epoch 3 of 4, and its servers are told the end as after a last epoch."""
    launcher = _Launcher(
        tmp_path,
        "strategy=parameter_server",
        "cluster.workers=2",
        "cluster.ps=1",
        "epochs=4",
        "early_stopping.patience=2",
        "early_stopping.monitor=train_loss",
        "early_stopping.min_delta=100",
        "checkpoint.keep_best=false",
        "loop.steps_per_epoch=30",
        "batch=32",
        WITH_MODEL,
        "strategy.variable_partitioner.max_shards=2",
        "strategy.variable_partitioner.min_shard_bytes=65536",
    )
    launcher.wait_for("epoch 1/4")
    tasks = cluster_tasks(launcher.process.pid)
    assert sorted(tasks) == ["chief 0", "ps 0", "worker 0", "worker 1"]
    os.kill(tasks["worker 1"], signal.SIGKILL)
    output = launcher.finish()
    assert launcher.process.returncode == 0, output[-3000:]
    assert "worker 1 died (killed by SIGKILL); restarting it" in output
    assert not [pid for pid in tasks.values() if is_running(pid)]
    # The servers (TF_CONFIG tasks) ended by themselves once the chief was done, as under SLURM.
    for name in ("ps-0", "worker-0"):
        log = (launcher.run_dir / "tasks" / f"{name}.log").read_text()
        assert f"the chief is done (finished): {name.replace('-', ' ')} ends with status 0" in log, log[-2000:]

    client, run = only_run(tmp_path)
    assert run.info.status == "FINISHED"
    assert len(_models(client, run)) == 1  # the coordinator's model, its variables gathered from the ps
    losses = train_losses(client, run.info.run_id)
    assert len(losses) == 3 and losses[-1] < losses[0], losses
    assert (run.data.tags["best_epoch"], run.data.tags["stopped_at_epoch"]) == ("1", "3")
    assert run.data.params["loop.steps_per_epoch"] == "30"

    # The coordinator's checkpoint, sharded variables and all, restores into a model without a strategy.
    import tensorflow as tf

    from runner.data.loading import load_data
    from runner.training.checkpoints import evaluate_without_strategy
    from runner.training.task import Experiment

    settings = _settings(*TWO_EPOCHS, "strategy=parameter_server", "cluster=local", "loop.steps_per_epoch=30")
    latest = tf.train.latest_checkpoint(str(launcher.run_dir / "checkpoints"))
    training_data = load_data(settings.dataset, settings.seed)
    task = Experiment.from_settings(settings, training_data.spec)
    model = task.build_model()
    tf.train.Checkpoint(model=model).restore(latest).expect_partial().assert_existing_objects_matched()
    scores = evaluate_without_strategy(latest, task.build_model, training_data.test_dataset(32), task.build_scores())
    accuracy = scores["accuracy"]
    assert accuracy == pytest.approx(run.data.metrics["eval_accuracy"], abs=1e-6)
    assert accuracy == pytest.approx(run.data.metrics["test_accuracy"], abs=1e-6)


@pytest.mark.slow
def test_a_killed_worker_stops_the_job_names_it_and_fails_the_run(tmp_path):
    launcher = _Launcher(tmp_path, "strategy=multi_worker_mirrored", "cluster.workers=2", "epochs=20", WITH_MODEL)
    launcher.wait_for("epoch 1/20")
    tasks = cluster_tasks(launcher.process.pid)
    assert sorted(tasks) == ["worker 0", "worker 1"]
    os.kill(tasks["worker 1"], signal.SIGKILL)
    output = launcher.finish(timeout=120)
    assert launcher.process.returncode == 2, output[-3000:]
    # The launcher's one paragraph ends the output. The chief's own last words come before it: when the
    # chief saw its peer go before the launcher stopped it, its paragraph on the lost peer.
    *chief_errors, error = [line for line in output.splitlines() if line.startswith("error: ")]
    assert output.strip().splitlines()[-1] == error
    assert all(line.startswith("error: another task of the cluster failed") for line in chief_errors), chief_errors
    assert error.startswith("error: worker 1 of the local cluster") and "killed by SIGKILL" in error, error
    assert "Fix:" in error and str(launcher.run_dir / "tasks" / "worker-1.log") in error
    # Killed outright, the worker said nothing: the launcher knows it from the outcome file it did not write.
    assert f"wrote no outcome ({launcher.run_dir / 'outcome-worker-1.json'})" in error, error
    # The launcher's own outcome, for whoever started it, is that paragraph.
    ended = outcome.read(str(launcher.run_dir / "outcome.json"), None)
    assert (ended.status, ended.exit_code, ended.paragraph) == ("FAILED", 2, error)
    # No task outlives the job: not the killed one, not the chief the launcher stopped.
    assert not [pid for pid in tasks.values() if is_running(pid)]
    assert _processes_mentioning(str(launcher.run_dir)) == []
    client, run = only_run(tmp_path)
    assert run.info.status == "FAILED"
    assert "worker 1 of the local cluster" in run.data.tags["error"]
    assert _models(client, run) == []
    assert ended.run_id == run.info.run_id  # the job's run, named for whoever started the launcher


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as handle:
        return int(next(line.split()[1] for line in handle if line.startswith("Threads:")))


@pytest.mark.slow
def test_multi_worker_mirrored_keeps_no_thread_per_all_reduce(tmp_path):
    """A timed all-reduce holds a thread for the whole timeout: with one per step, a long run dies of it."""
    launcher = _Launcher(
        tmp_path, "strategy=multi_worker_mirrored", "cluster.workers=2", "dataset.train_examples=4096", "epochs=3"
    )  # 32 steps an epoch, several all-reduces each
    launcher.wait_for("epoch 1/3")
    tasks = cluster_tasks(launcher.process.pid)
    after_one = {name: _threads(pid) for name, pid in tasks.items()}
    launcher.wait_for("epoch 2/3")
    after_two = {name: _threads(pid) for name, pid in tasks.items()}
    output = launcher.finish()
    assert launcher.process.returncode == 0, output[-3000:]
    # An epoch of 32 steps held about 200 more threads per worker with a 300 s all-reduce timeout.
    assert all(after_two[name] - after_one[name] < 50 for name in tasks), (after_one, after_two)


@pytest.mark.slow
@pytest.mark.alone  # the cluster must stop within 60 s of the freeze, and must not have ended before it
def test_a_frozen_worker_stops_a_tf_config_cluster_with_one_paragraph(tmp_path):
    """No launcher watches a TF_CONFIG cluster: TensorFlow's heartbeats must find a peer that froze."""
    from runner.clusters.local import free_ports

    run_dir, uri = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    workers = [f"localhost:{port}" for port in free_ports(2)]
    logs = [open(tmp_path / f"worker-{index}.err", "w") for index in range(2)]
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runner",
                *TWO_EPOCHS,
                "strategy=multi_worker_mirrored",
                "cluster=tf_config",
                "epochs=50",
                "dataset.train_examples=2048",
                f"mlflow.tracking_uri={uri}",
                f"hydra.run.dir={run_dir}",
            ],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=_env(
                TF_CONFIG=json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
            ),
        )
        for index, log in enumerate(logs)
    ]
    chief, worker = processes
    try:
        wait_for(lambda: checkpoints(run_dir), 180, "the first checkpoint", every=0.2, unless=exited(chief, "chief"))
        worker.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        chief.wait(timeout=120)
        assert time.monotonic() - frozen < 60
    finally:
        for process, log in zip(processes, logs, strict=True):
            process.kill()
            process.wait()
            log.close()
    stderr = (tmp_path / "worker-0.err").read_text()
    assert chief.returncode == 2, stderr[-3000:]
    [error] = stderr.strip().splitlines()[-1:]
    assert error.startswith("error: another task of the cluster failed or stopped answering during epoch "), error
    assert "/job:worker/replica:0/task:1" in error and "the checkpoints up to " in error
    assert f"hydra.run.dir={run_dir}" in error and "Traceback" not in stderr
    # Tasks of a cluster sharing the run directory: each says how it ended in a file of its own.
    ended = outcome.read(str(run_dir / "outcome-worker-0.json"), None)
    assert (ended.status, ended.exit_code, ended.paragraph, ended.task) == ("FAILED", 2, error, "worker 0")
    client, run = only_run(tmp_path)
    assert run.info.status == "FAILED" and "stopped answering" in run.data.tags["error"]

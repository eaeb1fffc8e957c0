"""Warm training workers (runner.sweeps.launch.warm_pool, runner.warm_worker): a sweep's runs trained one after another
in long-lived processes train the numbers a fresh process per run trains, on the devices each run asks for; a run that
fails, diverges or has its worker killed fails alone; nothing outlives the sweep. Real sweeps, real MLflow and Optuna
stores in tmp_path."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState

from helpers.cli import NOISE, cli_env
from helpers.config import compose
from helpers.models import TESTS_PATH
from helpers.processes import live_members, wait_group
from helpers.sweeps import children, client_for, parent_id_of, sweep_command, wait_until_training
from runner.errors import RunnerError
from runner.run_lock import LOCK_FILE
from runner.sweeps.launch.launchers import check_before_sweep
from runner.sweeps.launch.warm_pool import WorkerKind, worker_kind
from runner.sweeps.study.study import open_storage
from runner.sweeps.sweep_config import SweepConfig
from runner.sweeps.terms import JOURNAL_FILE

# What a run trains, bit for bit under runtime.deterministic; timings and the job's own wall time differ.
TRAINED = ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "eval_accuracy")
STARTED_WORKER = "started warm training worker pid"


@pytest.mark.parametrize(
    "overrides, kind",
    [
        ([], WorkerKind(1, False)),
        (["strategy=mirrored", "strategy.cpu_replicas=2", "runtime.deterministic=true"], WorkerKind(2, True)),
        (["strategy=one_device"], WorkerKind(1, False)),
        (["sweep.warm_workers=false"], None),
        (["strategy=multi_worker_mirrored"], None),
        (["strategy=parameter_server", "cluster=local"], None),
        (["cluster=tf_config"], None),
    ],
)
def test_a_worker_kind_is_what_tensorflow_fixes_for_a_process_and_clusters_get_none(overrides, kind):
    assert worker_kind(SweepConfig.read(compose(overrides))) == kind


@pytest.mark.parametrize(
    "target, refused",
    [
        ("hydra._internal.core_plugins.basic_launcher.BasicLauncher", False),
        ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", False),
        ("mylab.launchers.FarAwayLauncher", True),  # a user's own launcher: where its jobs run is unknown
    ],
)
def test_only_a_sweep_whose_jobs_run_on_its_machine_leaves_the_models_to_its_champion(target, refused):
    config = OmegaConf.create({"hydra": {"launcher": {"_target_": target}}})
    check_before_sweep(config, "every")
    if not refused:
        check_before_sweep(config, "champion")
        return
    with pytest.raises(RunnerError) as raised:
        check_before_sweep(config, "champion")
    message = str(raised.value)
    assert "hydra/launcher=faraway runs the jobs elsewhere" in message and "Fix: drop sweep.trial_models" in message


@contextmanager
def _sweep_in_session(tmp_path, sweep_dir, overrides) -> Iterator[subprocess.Popen]:
    """The sweep in its own session, tests/helpers on its PYTHONPATH; once the block ends, nothing it started may be
    left (within 20 s), and whatever is left then is killed."""
    process = subprocess.Popen(
        sweep_command(tmp_path, sweep_dir, overrides),
        cwd=tmp_path,
        env=cli_env({"PYTHONPATH": TESTS_PATH}),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield process
        assert wait_group(process, 20), f"processes {live_members(process.pid)} outlived the sweep"
    finally:
        if live_members(process.pid):
            os.killpg(process.pid, signal.SIGKILL)


def _run_sweep(tmp_path, name: str, *overrides: str) -> tuple[subprocess.CompletedProcess, list]:
    sweep_dir = tmp_path / name
    with _sweep_in_session(tmp_path, sweep_dir, overrides) as process:
        output, _ = process.communicate(timeout=400)
    done = subprocess.CompletedProcess(process.args, process.returncode, output, "")
    return done, children(client_for(tmp_path), parent_id_of(sweep_dir))


@pytest.mark.slow
def test_warm_and_cold_sweeps_train_the_same_numbers_on_the_devices_each_run_asks_for(tmp_path):
    """The same four deterministic runs (1 and 2 CPU replicas, two learning rates), once in a fresh process each and
    once in warm workers: every metric a run trains is the same, bit for bit; each run trained on the replicas it
    asked for (a worker per CPU split); every run is FINISHED when the sweep has ended, each with its model in the
    cold sweep, only the registered champion with one in the warm sweep (sweep.trial_models=champion), whose
    continuation to log it logged none of its metrics twice."""
    grid = (
        "strategy=mirrored",
        "strategy.cpu_replicas=1,2",
        "optimizer.lr=0.01,0.002",
        "runtime.deterministic=true",
        "mlflow.log_model=true",
    )
    cold, cold_runs = _run_sweep(tmp_path, "cold", *grid, "sweep.warm_workers=false")
    warm, warm_runs = _run_sweep(tmp_path, "warm", *grid, "sweep.trial_models=champion")
    assert cold.returncode == 0 and warm.returncode == 0, (cold.stdout[-3000:], warm.stdout[-3000:])

    for done in (cold, warm):  # verbose=false: none of TensorFlow's, absl's or MLflow's start-up lines, in any job
        assert [noise for noise in NOISE if noise in done.stdout] == [], done.stdout[-5000:]
    assert STARTED_WORKER not in cold.stdout
    assert warm.stdout.count(STARTED_WORKER) >= 2  # one per CPU split at least
    client = client_for(tmp_path)
    models = client.search_logged_models([cold_runs[0].info.experiment_id])
    with_model = {model.source_run_id for model in models}
    for runs in (cold_runs, warm_runs):
        assert len(runs) == 4 and {run.info.status for run in runs} == {"FINISHED"}
        for run in runs:
            assert run.data.params["num_replicas"] == run.data.params["strategy.cpu_replicas"]
    assert {run.info.run_id for run in cold_runs} <= with_model
    registered = client.get_run(parent_id_of(tmp_path / "warm")).data.tags["registered_model_version"]
    name, version = registered.split("/")
    champion = client.get_model_version(name, version).run_id
    assert {run.info.run_id for run in warm_runs} & with_model == {champion}
    assert (
        "the sweep logs this run's model at its end if it is the champion"
        in (tmp_path / "warm" / "0" / "runner.log").read_text()
    )
    for key in ("eval_accuracy", "test_accuracy", "train_loss"):
        assert len(client.get_metric_history(champion, key)) == 1, key
    by_point = {run.data.tags["configuration"]: run for run in cold_runs}
    for run in warm_runs:
        twin = by_point[run.data.tags["configuration"]]
        assert {key: run.data.metrics[key] for key in TRAINED} == {key: twin.data.metrics[key] for key in TRAINED}

    for job in range(4):
        assert "s after the process started" in (tmp_path / "cold" / str(job) / "runner.log").read_text()
        assert "s after the warm worker took the run" in (tmp_path / "warm" / str(job) / "runner.log").read_text()


def _kill_when_training(run_dir, process: subprocess.Popen) -> int:
    """SIGKILL the process that trains in run_dir (its lock's holder) once it trains; its pid."""
    wait_until_training(process, run_dir / "runner.log", "the long trial")
    pid = int((run_dir / LOCK_FILE).read_text().strip())
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.slow
def test_a_raising_model_a_diverging_run_and_a_killed_worker_fail_alone_and_the_study_completes(tmp_path):
    """Five Optuna trials in warm workers: one whose user model raises, one whose loss goes NaN, one whose worker the
    OS kills mid-run (SIGKILL), between two that train. Those three runs are FAILED with their reason, the other two
    FINISHED (the last in a fresh worker), the study has its five trials, and nothing outlives the sweep. A worker
    past sweep.worker_memory_mb is replaced after its run."""
    good = "model._target_=runner.builtins.models.cnn optimizer.lr=0.01 epochs=1"
    queued = [
        good,
        "model._target_=helpers.models.model_that_raises optimizer.lr=0.01 epochs=1",
        "model._target_=runner.builtins.models.cnn optimizer.lr=1e12 epochs=1",
        "model._target_=runner.builtins.models.cnn optimizer.lr=0.01 epochs=400",
        good,
    ]
    sweep_dir = tmp_path / "sweep"
    overrides = (
        "hparams_search=optuna",
        "hydra.sweeper.n_trials=5",
        "model._target_=choice(runner.builtins.models.cnn,helpers.models.model_that_raises)",
        "optimizer.lr=choice(0.01,1e12)",
        "epochs=choice(1,400)",
        "hydra.sweeper.enqueue=[" + ",".join(f'"{item}"' for item in queued) + "]",
        "sweep.worker_memory_mb=1",
    )
    with _sweep_in_session(tmp_path, sweep_dir, overrides) as process:
        killed = _kill_when_training(sweep_dir / "3", process)
        output, _ = process.communicate(timeout=400)
    assert process.returncode != 0, output[-3000:]  # a sweep with failed jobs says so

    runs = children(client_for(tmp_path), parent_id_of(sweep_dir))
    assert [run.info.status for run in runs] == ["FINISHED", "FAILED", "FAILED", "FAILED", "FINISHED"]
    errors = [run.data.tags.get("error", "") for run in runs]
    assert "raised RuntimeError when the runner called it: this model cannot be built" in errors[1]
    assert "loss became NaN or infinite" in errors[2]
    assert errors[3].startswith("the training process was killed by SIGKILL and wrote no outcome")
    study = optuna.load_study(study_name="fashion_mnist", storage=open_storage(str(sweep_dir / JOURNAL_FILE)))
    assert len(study.trials) == 5 and all(trial.state != TrialState.RUNNING for trial in study.trials)
    assert STARTED_WORKER in output and f"pid {killed}" in output
    assert "more than sweep.worker_memory_mb=1: replaced by a fresh one" in output

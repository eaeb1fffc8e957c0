"""Sweeps over seeds: a configuration is the jobs that differ only in `seed`, summarized by n, mean and
standard deviation; `sweep.seeds=N` trains every point with N seeds; a re-run trains only missing seeds.

Real `python -m runner -m ...` processes against a real MLflow sqlite store, tiny synthetic data."""

from __future__ import annotations

import statistics
import subprocess
import time

import optuna
import pytest
import yaml

from helpers.sweeps import children, client_for, kill_sweep_while_training, parent_id_of, summary_rows, sweep_command
from runner.metric_table import DEFAULT_TABLE
from runner.sweeps.report.summary import CSV_FILE, CURVES_FILE, JOBS_CSV_FILE
from runner.sweeps.study.study import REPLICATES_ATTR, open_storage
from runner.sweeps.terms import JOURNAL_FILE
from runner.tracking.mlflow_tracker import run_model

pytestmark = pytest.mark.slow


def sweep(tmp_path, sweep_dir, *overrides) -> subprocess.CompletedProcess:
    # Up to six training processes one after another (two at a time with joblib) on a busy machine.
    return subprocess.run(
        sweep_command(tmp_path, sweep_dir, overrides), cwd=tmp_path, capture_output=True, text=True, timeout=900
    )


def _by_configuration(runs) -> dict[str, list]:
    grouped = {}
    for run in runs:
        grouped.setdefault(run.data.tags["configuration"], []).append(run)
    return grouped


def test_two_configurations_by_three_seeds_are_summarized_per_configuration(tmp_path):
    """The two configurations are the CNN's two Keras lanes: a Keras 3 model sweeps and seeds as a tf_keras one."""
    sweep_dir = tmp_path / "sweep"
    result = sweep(
        tmp_path, sweep_dir, "seed=1,2,3", "runtime.keras=2,3", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    client = client_for(tmp_path)
    parent_id = parent_id_of(sweep_dir)
    runs = children(client, parent_id)
    assert len(runs) == 6 and all(run.info.status == "FINISHED" for run in runs)
    grouped = _by_configuration(runs)
    assert sorted(grouped) == ["runtime.keras=2", "runtime.keras=3"]
    for name, group in grouped.items():
        assert sorted(run.data.tags["seed"] for run in group) == ["1", "2", "3"]
        assert sorted(run.data.params["seed"] for run in group) == ["1", "2", "3"]  # what they trained with
        # Each trained in the Keras its configuration names.
        lane = "keras 3." if name == "runtime.keras=3" else "tf_keras 2."
        assert all(run.data.tags["keras"].startswith(lane) for run in group), [r.data.tags["keras"] for r in group]

    rows = summary_rows(sweep_dir, CSV_FILE)
    assert [row["configuration"] for row in rows] and sorted(row["configuration"] for row in rows) == sorted(grouped)
    for row in rows:
        group = grouped[row["configuration"]]
        assert row["n"] == "3"
        # The statistics of the children's own final metrics, to the last bit (val_*: only with a validation split).
        for key in (key for key in DEFAULT_TABLE.result_keys if key in group[0].data.metrics):
            values = [run.data.metrics[key] for run in group]
            assert float(row[f"{key}_mean"]) == statistics.fmean(values), key
            assert float(row[f"{key}_std"]) == statistics.stdev(values), key
        assert sorted(row["run_ids"].split()) == sorted(run.info.run_id for run in group)
    assert len(summary_rows(sweep_dir, JOBS_CSV_FILE)) == 6
    assert (sweep_dir / CURVES_FILE).stat().st_size > 0

    # The best configuration by the mean of the objective, on the parent run and in the printed table.
    means = {
        name: statistics.fmean(run.data.metrics["test_accuracy"] for run in group) for name, group in grouped.items()
    }
    best = max(means, key=means.get)
    parent = client.get_run(parent_id)
    assert parent.data.tags["best_configuration"] == best
    assert parent.data.metrics["best_test_accuracy_mean"] == means[best]
    assert parent.data.metrics["best_test_accuracy_std"] == statistics.stdev(
        run.data.metrics["test_accuracy"] for run in grouped[best]
    )
    # The best single job (the run that stands for the sweep) is taken within the best configuration.
    best_job = max(grouped[best], key=lambda run: run.data.metrics["test_accuracy"])
    assert parent.data.metrics["best_test_accuracy"] == best_job.data.metrics["test_accuracy"]
    assert f"best test_accuracy: {means[best]:.4f} ± " in result.stdout
    assert f"(mean of 3), configuration {best}" in result.stdout
    assert "6 jobs, 6 finished, 0 failed, in 2 configurations" in result.stdout


def test_optuna_with_sweep_seeds_optimizes_the_mean_over_seeds_and_its_terminator_ends_a_study_with_no_room_left(
    tmp_path,
):
    """Each trial trains seeds 10 and 11 and is valued at their mean test_loss (minimized). The learning rates are too
    small to move the weights, so every configuration scores as the first: with hydra.sweeper.terminate=regret the
    study ends after two of its three trials, its room for improvement far below the noise between the seeds. Early
    stopping that no epoch after the first can satisfy ends each run (on two mirrored replicas) after epoch 2 of 3, a
    finished run that the summary shows stopped there, whose objective and model are epoch 1's, and the champion is
    the best of them."""
    sweep_dir = tmp_path / "sweep"
    result = sweep(
        tmp_path,
        sweep_dir,
        "hparams_search=optuna",
        "hydra.sweeper.n_trials=3",
        "sweep.seeds=2",
        "seed=10",
        "sweep.objective=test_loss",
        "hydra.sweeper.direction=minimize",
        "optimizer.lr=tag(log, interval(1e-9, 2e-9))",
        "hydra.sweeper.terminate=regret",
        "hydra.sweeper.terminate_min_trials=2",
        "epochs=3",
        "early_stopping.patience=1",
        "early_stopping.monitor=train_loss",
        "early_stopping.min_delta=100",
        "strategy=mirrored",  # two replicas: the stop and the best epoch's weights follow the all-reduced metrics
        "strategy.cpu_replicas=2",
        "mlflow.log_model=True",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    client = client_for(tmp_path)
    runs = children(client, parent_id_of(sweep_dir))
    assert len(runs) == 4 and all(run.info.status == "FINISHED" for run in runs)
    assert [run.data.tags.get("stopped_at_epoch") for run in runs] == ["2"] * 4
    assert [row["stopped_at_epoch"] for row in summary_rows(sweep_dir, JOBS_CSV_FILE)] == ["2"] * 4
    # Each objective is its best epoch's, the model it hands over (keep_best): epoch 1's test_loss, logged again;
    # the restored model evaluates as epoch 1's weights did.
    for run in runs:
        assert run.data.params["num_replicas"] == "2"
        first, *_, latest = client.get_metric_history(run.info.run_id, "test_loss")
        assert (first.step, latest.step) == (1, 3) and run.data.metrics["test_loss"] == first.value
        [(step, accuracy), *_] = sorted(
            (m.step, m.value) for m in client.get_metric_history(run.info.run_id, "test_accuracy")
        )
        assert step == 1 and run.data.metrics["eval_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert result.stdout.count("FINISHED, stopped early at epoch 2") == 4  # the jobs table
    assert (sweep_dir / "sweep_report.html").read_text().count("FINISHED, stopped early at epoch 2") == 4  # its runs
    trials = {}
    for run in runs:
        trials.setdefault(run.data.tags["job_number"], []).append(run)
    assert sorted(trials) == ["0", "1"]  # the third trial was never asked
    for number, group in trials.items():
        assert sorted(run.data.params["seed"] for run in group) == ["10", "11"]  # seed, seed + 1
        assert len({run.data.tags["configuration"] for run in group}) == 1
        for run in group:
            assert run.info.run_name.endswith(f",seed={run.data.params['seed']}")
            assert (sweep_dir / number / f"seed-{run.data.params['seed']}" / "outcome.json").exists()
    means = [statistics.fmean(run.data.metrics["test_loss"] for run in group) for group in trials.values()]
    reported = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert reported["best_value"] == pytest.approx(min(means), rel=1e-12)
    # The champion is the best configuration's best seed by the objective, its served model epoch 1's (keep_best):
    # the LoggedModel links that epoch's eval_accuracy.
    best_group = list(trials.values())[means.index(min(means))]
    best_run = min(best_group, key=lambda run: run.data.metrics["test_loss"])
    champion = client.get_model_version_by_alias("synthetic", "champion")
    assert champion.run_id == best_run.info.run_id
    assert float(champion.tags["objective_value"]) == pytest.approx(best_run.data.metrics["test_loss"], rel=1e-12)
    served = run_model(client, champion.run_id)
    assert champion.source == served.artifact_location  # the registered version is that LoggedModel
    linked = {metric.key: (metric.step, metric.value) for metric in served.metrics}
    assert linked["eval_accuracy"] == (1, pytest.approx(best_run.data.metrics["eval_accuracy"]))
    # Each trial keeps its seeds' objectives, from which the terminator measured the noise.
    study = optuna.load_study(study_name="fashion_mnist", storage=open_storage(str(sweep_dir / JOURNAL_FILE)))
    for trial in study.trials:
        by_seed = {run.data.params["seed"]: run.data.metrics["test_loss"] for run in trials[str(trial.number)]}
        assert trial.user_attrs[REPLICATES_ATTR] == pytest.approx([by_seed["10"], by_seed["11"]], rel=1e-12)
    said = "the study stopped after 2 completed trials: the most its best configuration could still improve"
    assert said in reported["stopped_early"]
    assert f"Ended early: {said}" in result.stdout
    assert said in client.get_run(parent_id_of(sweep_dir)).data.tags["study_stopped_early"]


def test_a_rerun_trains_only_the_seeds_that_did_not_finish(tmp_path):
    sweep_dir = tmp_path / "sweep"
    overrides = ("batch=32", "sweep.seeds=3", "seed=7")
    # Kill the whole sweep while the second seed (8) trains: seed 7 is done, 8 is cut short, 9 never began.
    kill_sweep_while_training(tmp_path, sweep_dir, overrides, sweep_dir / "0" / "seed-8" / "runner.log", "seed 8")
    client = client_for(tmp_path)
    before = {run.data.tags["seed"]: run for run in children(client, parent_id_of(sweep_dir))}
    assert {seed: run.info.status for seed, run in before.items()} == {"7": "FINISHED", "8": "RUNNING"}

    rerun_started_ms = time.time() * 1000
    result = sweep(tmp_path, sweep_dir, *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    after = {run.data.tags["seed"]: run for run in children(client, parent_id_of(sweep_dir))}
    assert sorted(after) == ["7", "8", "9"] and all(run.info.status == "FINISHED" for run in after.values())
    assert result.stdout.count("already FINISHED") == 1  # seed 7 was not trained again
    assert "seed=7) already FINISHED" in result.stdout
    seed_7 = after["7"]
    assert seed_7.info.run_id == before["7"].info.run_id
    assert seed_7.info.end_time < rerun_started_ms  # finished before the re-run began, untouched since
    assert after["8"].info.run_id == before["8"].info.run_id  # continued, not duplicated
    assert after["9"].info.start_time > rerun_started_ms
    [row] = summary_rows(sweep_dir, CSV_FILE)
    assert row["n"] == "3"

"""Optuna sweeps end to end: real `python -m runner hparams_search=optuna ...` processes, a real Optuna study in a
journal file of the sweep directory, a real MLflow sqlite store in tmp_path. One pruned study on two slots checks
pruning, the summary and the free slot together; one killed and re-run study checks that a study survives."""

from __future__ import annotations

import subprocess
import sys

import optuna
import pytest
from optuna.trial import TrialState

from helpers.cli import run_cli
from helpers.presets import SWEEP_JOB
from helpers.sweeps import (
    children,
    client_for,
    killed_while_frozen,
    left_running_then_stopped,
    parent_id_of,
    summary_rows,
    sweep,
    sweep_command,
    without_generated_line,
)
from helpers.waiting import wait_for
from runner.sweeps.report.report import REPORT_FILE
from runner.sweeps.report.summary import CSV_FILE, MARKDOWN_FILE
from runner.sweeps.study.grid_study import GRID_STUDY
from runner.sweeps.study.study import DUPLICATE_ATTR, PRUNED_TAG, open_storage
from runner.sweeps.terms import JOURNAL_FILE

GOOD, BAD = "optimizer.lr=0.01", "optimizer.lr=1e-09"  # BAD cannot learn: its loss stays where it began


def _study(sweep_dir, name="fashion_mnist") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(str(sweep_dir / JOURNAL_FILE)))


@pytest.mark.slow
def test_a_pruned_study_on_two_slots(tmp_path):
    """Six trials on two joblib slots, queued in this order: three that learn (the third for more epochs), then
    three that cannot. The median pruner (after two complete trials) stops each that cannot after its first epoch;
    the slot it frees takes the next trial while the other slot's long trial is still training."""
    sweep_dir = tmp_path / "sweep"
    queued = [f"{GOOD} epochs=2", f"{GOOD} epochs=2", f"{GOOD} epochs=8", *[f"{BAD} epochs=2"] * 3]
    result = sweep(
        tmp_path,
        sweep_dir,
        "hparams_search=optuna",
        "pruner=median",
        "pruner.n_startup_trials=2",
        "hydra.sweeper.n_trials=6",
        f"optimizer.lr=choice({GOOD.split('=')[1]},{BAD.split('=')[1]})",
        "epochs=choice(2,8)",
        "batch=64",
        "hydra.sweeper.enqueue=[" + ",".join(f'"{item}"' for item in queued) + "]",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "dataset.train_examples=512",
        # A loss moves at every step (an accuracy over few examples may not yet after one epoch).
        "sweep.objective=test_loss",
        "hydra.sweeper.direction=minimize",
        "runtime.deterministic=true",  # the good trials' curves are identical: none is pruned against the others
        "mlflow.log_model=true",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (sweep_dir / "multirun.yaml").exists()

    study = _study(sweep_dir)
    states = [trial.state for trial in sorted(study.trials, key=lambda trial: trial.number)]
    assert states == [TrialState.COMPLETE] * 3 + [TrialState.PRUNED] * 3
    pruned = [trial for trial in study.trials if trial.state == TrialState.PRUNED]
    assert all(trial.params["optimizer.lr"] == 1e-09 and trial.last_step == 1 for trial in pruned)

    client = client_for(tmp_path)
    parent_id = parent_id_of(sweep_dir)
    runs = children(client, parent_id)
    assert [run.data.tags["job_number"] for run in runs] == [str(n) for n in range(6)]  # job N is trial N
    assert all(run.info.status == "FINISHED" for run in runs)
    for run in runs[3:]:
        assert run.data.tags[PRUNED_TAG] == "1"
        assert [m.step for m in client.get_metric_history(run.info.run_id, "test_accuracy")] == [1]
        assert "eval_accuracy" not in run.data.metrics
        assert (sweep_dir / run.data.tags["job_number"] / "checkpoints" / "checkpoint").exists()  # kept
    for run, epochs in zip(runs[:3], (2, 2, 8), strict=True):
        assert PRUNED_TAG not in run.data.tags
        assert len(client.get_metric_history(run.info.run_id, "test_accuracy")) == epochs
    experiment = runs[0].info.experiment_id
    with_model = {model.source_run_id for model in client.search_logged_models([experiment])}
    assert with_model == {run.info.run_id for run in runs[:3]}  # a pruned trial logs no model
    [version] = client.search_model_versions("name = 'synthetic'")
    assert version.run_id in with_model  # the registered best is a trial that trained every epoch

    rows = summary_rows(sweep_dir)
    assert [row[PRUNED_TAG] for row in rows] == ["", "", "", "1", "1", "1"]
    assert "6 jobs, 3 finished, 3 pruned, 0 failed, in 3 configurations" in result.stdout
    configurations = (sweep_dir / MARKDOWN_FILE).read_text()
    [pruned_row] = [line for line in configurations.splitlines() if "| pruned at epoch 1 |" in line]
    assert "optimizer.lr=1e-09" in pruned_row and pruned_row.endswith("|  |  |  |  |  |  |  |")  # not compared
    assert configurations in result.stdout
    assert result.stdout.count("| pruned at epoch 1 |") == 4  # the configuration, and each of its three jobs

    # The report marks the pruned configuration and draws the study's parameter importances; rebuilt from the
    # sweep directory (its store read from multirun.yaml, its study found there), it is the same page.
    report = (sweep_dir / REPORT_FILE).read_text()
    assert 'id="param-importances"' in report and "pruned: not compared" in report and "pruned at epoch 1" in report
    rebuilt = subprocess.run(
        [sys.executable, "-m", "runner.report", str(sweep_dir), "--out", str(tmp_path / "elsewhere")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert without_generated_line((tmp_path / "elsewhere" / REPORT_FILE).read_text()) == without_generated_line(report)

    # Trial 2 (8 epochs and a model) and trial 3 (pruned after 1) ran side by side; trial 4 took trial 3's slot
    # while trial 2 was still training.
    ends = {int(run.data.tags["job_number"]): run.info.end_time for run in runs}
    starts = {int(run.data.tags["job_number"]): run.info.start_time for run in runs}
    assert starts[4] < ends[2], (starts, ends)
    assert ends[3] < ends[2]


@pytest.mark.slow
def test_a_killed_study_stops_its_training_and_a_rerun_continues_it_to_six_distinct_trials(tmp_path):
    """kill -9 of the sweep's process while trial 2 trains: the training process it left notices and stops
    (KILLED, resumable, a checkpoint saved) instead of training on as an orphan; the same command then resumes trial
    2 from that checkpoint in the same MLflow run and asks trials 3-5 from where the sampler's draws stopped (a
    sampler rebuilt with its seed would repeat trials 0 and 1): six trials, six configurations."""
    sweep_dir = tmp_path / "sweep"
    # The search space of hparams_search=optuna (log learning rate, batch) with its TPE sampler, seed 42; one slot.
    overrides = ("hparams_search=optuna", "hydra.sweeper.n_trials=6", "epochs=2", "dataset.train_examples=512")
    process, frozen = killed_while_frozen(tmp_path, sweep_dir, overrides, "2")
    left_running_then_stopped(process, frozen)
    before = {trial.number: trial for trial in _study(sweep_dir).trials}
    assert [before[n].state for n in range(3)] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.RUNNING]
    client = client_for(tmp_path)
    runs_before = {run.data.tags["job_number"]: run for run in children(client, parent_id_of(sweep_dir))}
    assert runs_before["2"].info.status == "KILLED" and runs_before["2"].data.tags["resumable"] == "true"
    assert "the sweep that started this training is gone" in (sweep_dir / "2" / "runner.log").read_text()

    result = sweep(tmp_path, sweep_dir, *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stdout + result.stderr
    after = sorted(_study(sweep_dir).trials, key=lambda trial: trial.number)
    assert [(trial.number, trial.state) for trial in after] == [(n, TrialState.COMPLETE) for n in range(6)]
    assert [trial.params for trial in after[:3]] == [before[n].params for n in range(3)]  # trial 2 ran as itself
    assert len({tuple(sorted(trial.params.items())) for trial in after}) == 6, [trial.params for trial in after]
    runs = children(client, parent_id_of(sweep_dir))
    assert [run.data.tags["job_number"] for run in runs] == [str(n) for n in range(6)]  # one child run per trial
    assert all(run.info.status == "FINISHED" for run in runs)
    for number in ("0", "1"):  # not trained again
        assert runs[int(number)].info.end_time == runs_before[number].info.end_time
    assert runs[2].info.run_id == runs_before["2"].info.run_id  # continued, not duplicated
    assert "trial 2 was left running by an earlier command: it runs again" in said
    log = (sweep_dir / "2" / "runner.log").read_text()
    # Its advice is the sweep's re-run (which did continue it), not a single run's.
    assert f"KILLED and resumable: re-run the sweep's command with hydra.sweep.dir={sweep_dir}, which continues" in log
    # Frozen once it started training: if that was before its first step (tracing takes seconds under load), it
    # stopped with nothing to save and trial 2 trains afresh; otherwise it resumes from the checkpoint it saved.
    if "preempted: stopped by SIGTERM before its first step" in log:
        assert "resuming after epoch" not in log and log.count("epoch 1/2: ") == 1
    else:
        assert "preempted: stopped by SIGTERM after saving " in log and "resuming after epoch" in log


@pytest.mark.slow
def test_a_rerun_waits_for_a_frozen_orphan_and_a_small_space_trains_no_configuration_twice(tmp_path):
    """Two joblib slots over a 2 x 2 space, 6 trials: a configuration the sampler proposes again is told its
    result, never trained twice. The sweep is killed while trial 2's training is frozen (SIGSTOP), and the same
    command is started at once: it finds trial 2's directory held by that orphan and waits for it, saying so; the
    orphan, let go, stops by itself, and the re-run resumes it. Nothing FAILED; each configuration is one run."""
    sweep_dir = tmp_path / "sweep"
    overrides = (
        "hparams_search=optuna",
        "hydra.sweeper.n_trials=6",
        "batch=choice(32, 64)",  # in place of hparams_search=optuna's own space
        "optimizer.lr=choice(0.01, 0.001)",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "epochs=2",
        "dataset.train_examples=512",
    )
    process, frozen = killed_while_frozen(tmp_path, sweep_dir, overrides, "2")
    with open(tmp_path / "rerun.log", "w") as log:
        rerun = subprocess.Popen(
            sweep_command(tmp_path, sweep_dir, overrides), cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        waiting = f"pid {frozen}: "
        wait_for(lambda: waiting in (tmp_path / "rerun.log").read_text(), 240, "the re-run waiting for the orphan")
        assert rerun.poll() is None and "still holds" in (tmp_path / "rerun.log").read_text()
        left_running_then_stopped(process, frozen)
        assert rerun.wait(timeout=300) == 0, (tmp_path / "rerun.log").read_text()[-3000:]
    finally:
        rerun.kill()
    said = (tmp_path / "rerun.log").read_text()
    assert "the earlier training process ended; continuing" in said

    study = _study(sweep_dir)
    assert len(study.trials) == 6 and all(trial.state == TrialState.COMPLETE for trial in study.trials)
    trained = [trial for trial in study.trials if DUPLICATE_ATTR not in trial.user_attrs]
    repeats = [trial for trial in study.trials if DUPLICATE_ATTR in trial.user_attrs]
    assert repeats and len({tuple(sorted(t.params.items())) for t in trained}) == len(trained)
    runs = children(client_for(tmp_path), parent_id_of(sweep_dir))
    assert sorted(int(run.data.tags["job_number"]) for run in runs) == sorted(trial.number for trial in trained)
    assert all(run.info.status == "FINISHED" for run in runs)  # nothing FAILED, the orphan's run continued
    assert len({run.data.tags["configuration"] for run in runs}) == len(runs)
    assert [row["n"] for row in summary_rows(sweep_dir, CSV_FILE)] == ["1"] * len(runs)
    log = (sweep_dir / "2" / "runner.log").read_text()
    # Frozen once it started training: let go, it may stop before its first step (nothing to save: the re-run trains
    # its run afresh) or after it (the re-run resumes from the checkpoint it saved).
    if "preempted: stopped by SIGTERM before its first step" in log:
        assert "resuming after epoch" not in log and log.count("epoch 1/2: ") == 1
    else:
        assert "resuming after epoch" in log


@pytest.mark.slow
def test_a_grid_sweep_with_a_pruner_prunes_its_folds_and_a_rerun_counts_no_job_twice(tmp_path):
    """Hydra's basic sweeper over two learning rates, two folds each, median pruner after one complete job: a job's
    folds report to its one trial as consecutive steps (fold 1's epoch e is step 2 + e); the job that cannot learn
    is pruned after its first fold's first epoch against the first job's, and its second fold never trains. The
    same command again skips every finished run and adds no trial. The CNN is Keras 3's (runtime.keras=3): folds
    and pruning are the same for either Keras."""
    sweep_dir = tmp_path / "sweep"
    overrides = (
        "pruner=median",
        "pruner.n_startup_trials=1",
        "pruner.n_warmup_steps=0",
        "epochs=2",
        "batch=64",
        "dataset.train_examples=512",
        "sweep.folds=2",
        "runtime.keras=3",
        "sweep.objective=test_loss",  # a loss moves at every step; minimized, as its name says
        f"optimizer.lr={GOOD.split('=')[1]},{BAD.split('=')[1]}",
    )
    result = sweep(tmp_path, sweep_dir, *overrides)
    assert result.returncode == 0, result.stderr[-3000:]

    trials = sorted(_study(sweep_dir, name=GRID_STUDY).trials, key=lambda trial: trial.number)
    assert [(trial.user_attrs["job_number"], trial.state) for trial in trials] == [
        (0, TrialState.COMPLETE),
        (1, TrialState.PRUNED),
    ]
    assert list(trials[0].intermediate_values) == [1, 2, 3, 4] and list(trials[1].intermediate_values) == [1]
    client = client_for(tmp_path)
    runs = sorted(
        children(client, parent_id_of(sweep_dir)),
        key=lambda run: (int(run.data.tags["job_number"]), run.data.tags["fold"]),
    )
    assert [(run.data.tags["job_number"], run.data.tags["fold"]) for run in runs] == [
        ("0", "0"),
        ("0", "1"),
        ("1", "0"),
    ]
    assert [run.info.status for run in runs] == ["FINISHED"] * 3
    assert [run.data.tags.get(PRUNED_TAG) for run in runs] == [None, None, "1"]
    assert [m.step for m in client.get_metric_history(runs[2].info.run_id, "test_loss")] == [1]
    assert sorted(row[PRUNED_TAG] for row in summary_rows(sweep_dir)) == ["", "", "1"]

    again = sweep(tmp_path, sweep_dir, *overrides)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(_study(sweep_dir, name=GRID_STUDY).trials) == 2
    assert sorted(run.info.run_id for run in children(client, parent_id_of(sweep_dir))) == sorted(
        run.info.run_id for run in runs
    )
    assert not (sweep_dir / "1" / "fold-1").exists()  # job 1's second fold never trained, nor on the re-run
    assert "2 configurations" in again.stdout and "1 pruned" in again.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cluster", "good_lr"),
    [
        (("strategy=multi_worker_mirrored", "cluster.workers=2", "batch=32"), GOOD.split("=")[1]),
        # Two workers' asynchronous updates at 0.01 overshoot in the first epochs: its test_loss can begin above the
        # bad rate's (which stays where it began), and nothing would be pruned. At 0.001 it falls from the first epoch.
        (("strategy=parameter_server", "loop.steps_per_epoch=8"), "0.001"),
    ],
    ids=["multi_worker_mirrored", "parameter_server"],
)
def test_a_pruned_cluster_trial_stops_every_task(tmp_path, cluster, good_lr):
    """A grid sweep of two learning rates, each job a local cluster, median pruner after one complete job. The rate
    that cannot learn is pruned before its last epoch: under MultiWorkerMirrored the chief's decision is every
    worker's (both stop after the same epoch, in step, with the chief's checkpoint of it), under ParameterServer the
    coordinator stops and its servers are told the end; either way the job ends as a pruned trial does."""
    sweep_dir = tmp_path / "sweep"
    result = sweep(
        tmp_path,
        sweep_dir,
        *cluster,
        "cluster=local",
        "pruner=median",
        "pruner.n_startup_trials=1",
        "pruner.n_warmup_steps=0",
        "epochs=3",
        "sweep.objective=test_loss",
        f"optimizer.lr={good_lr},{BAD.split('=')[1]}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    trials = sorted(_study(sweep_dir, name=GRID_STUDY).trials, key=lambda trial: trial.number)
    assert [trial.state for trial in trials] == [TrialState.COMPLETE, TrialState.PRUNED]
    pruned_at = trials[1].last_step  # the first epoch its test_loss is behind the good job's at that epoch
    assert pruned_at < 3 and list(trials[1].intermediate_values) == list(range(1, pruned_at + 1))
    client = client_for(tmp_path)
    runs = sorted(children(client, parent_id_of(sweep_dir)), key=lambda run: run.data.tags["job_number"])
    assert [run.info.status for run in runs] == ["FINISHED", "FINISHED"]
    assert [run.data.tags.get(PRUNED_TAG) for run in runs] == [None, str(pruned_at)]
    history = client.get_metric_history(runs[1].info.run_id, "test_loss")
    assert [m.step for m in history] == list(trials[1].intermediate_values)
    assert len(client.get_metric_history(runs[0].info.run_id, "test_loss")) == 3
    steps = pruned_at * (4 if "multi_worker_mirrored" in cluster[0] else 8)  # 256 / (2 x 32), or steps_per_epoch
    assert [path.name for path in (sweep_dir / "1" / "checkpoints").glob("*.index")] == [f"ckpt-{steps}.index"]
    if "multi_worker_mirrored" in cluster[0]:
        worker = (sweep_dir / "1" / "tasks" / "worker-1.log").read_text()
        # It trained the chief's epochs and no more, and ended in step with it.
        assert f"epoch {pruned_at}/3: " in worker and f"epoch {pruned_at + 1}/3" not in worker
        # Not left alone in the next epoch's all-reduces, failing once the chief has gone.
        assert "error:" not in worker, worker[-2000:]
    assert sorted(row[PRUNED_TAG] for row in summary_rows(sweep_dir)) == ["", str(pruned_at)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "paragraph"),
    [
        (("pruner=bogus",), "pruner=bogus"),
        (
            ("hparams_search=optuna", "pruner=median", "+pruner.n_warmup_step=1"),
            "pruner.n_warmup_step is not valid: optuna.pruners.MedianPruner takes no argument 'n_warmup_step' (did "
            "you mean pruner.n_warmup_steps?)",
        ),
        (
            ("hparams_search=optuna", "pruner=median", "sweep.objective=eval_accuracy"),
            "sweep.objective='eval_accuracy' is not valid: pruner=median compares each epoch's objective, and",
        ),
        (
            ("hparams_search=optuna", "pruner=wilcoxon"),
            "pruner='wilcoxon' is not valid: it compares a configuration's seeds or folds, one by one",
        ),
        (
            ("hparams_search=optuna", "hydra.sweeper.terminate=regret"),
            "hydra.sweeper.terminate='regret' is not valid: it stops the study once the most its best configuration",
        ),
        (
            ("hparams_search=optuna", "sweep.seeds=2", "hydra.sweeper.terminate=regrets"),
            "hydra.sweeper.terminate='regrets' is not valid: the study terminators are regret",
        ),
        (
            ("optimizer.lr=0.01,0.001", "sweep.seeds=2", "hydra.sweeper.terminate=regret"),
            "hydra.sweeper.terminate=regret is not valid with a grid sweep (hydra._internal.core_plugins.basic_sweeper."
            "BasicSweeper): a terminator ends an Optuna study",
        ),
        (
            (
                "hparams_search=optuna",
                "sweep.objective=val_loss",
                "hydra.sweeper.direction=maximize",
                "sweep.direction=minimize",
            ),
            "hydra.sweeper.direction=maximize is not valid with sweep.direction=minimize: a sweep has one direction",
        ),
        (
            ("hparams_search=optuna", "hydra.sweeper.storage=postgresql+psycopg2://me@127.0.0.1:1/optuna"),
            "hydra.sweeper.storage='postgresql+psycopg2://me@127.0.0.1:1/optuna' could not be opened: OperationalError",
        ),
    ],
)
def test_a_sweep_that_cannot_prune_or_store_its_study_stops_before_its_parent_run(tmp_path, overrides, paragraph):
    sweep_dir = tmp_path / "sweep"
    result = sweep(tmp_path, sweep_dir, *overrides)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert paragraph in line and "Fix: " in line
    assert not (sweep_dir / "mlflow_parent_run_id.txt").exists()  # no parent run


@pytest.mark.slow
def test_a_pruner_without_a_sweep_is_one_paragraph(tmp_path):
    result = run_cli(*SWEEP_JOB, "pruner=median", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: pruner=median is not valid without a sweep") and "Fix: " in last
    assert not client_for(tmp_path).search_runs(["0"])


@pytest.mark.slow
def test_a_two_objective_study_shows_its_front_never_chooses_an_infeasible_width_and_registers_by_the_rule(tmp_path):
    """Accuracy against size: the CNN's dense width (16, 64, 256, each queued once, then one trial TPE proposes,
    which repeats one of them), two seeds each, val_accuracy maximized and parameters minimized, the widest excluded
    by `parameters <= 200000`; only the chosen model is exported (sweep.trial_models=champion). The front the
    summary shows is the one computed here from the runs; the chosen and registered configuration is the best mean
    val_accuracy among the feasible (the documented rule); the widest is shown infeasible and its trials tell Optuna
    so."""
    sweep_dir = tmp_path / "sweep"
    widths = ("16", "64", "256")
    result = sweep(
        tmp_path,
        sweep_dir,
        "hparams_search=optuna",
        "hydra.sweeper.n_trials=4",
        "optimizer.lr=0.01",  # in place of hparams_search=optuna's own space: the width alone is searched
        "batch=32",
        "+model.dense_units=choice(16,64,256)",
        "hydra.sweeper.enqueue=[" + ",".join(f'"+model.dense_units={width}"' for width in widths) + "]",
        "sweep.objective=[val_accuracy,parameters]",
        "sweep.constraints=['parameters <= 200000']",
        "sweep.seeds=2",
        "mlflow.log_model=true",
        "sweep.trial_models=champion",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    client = client_for(tmp_path)
    parent = client.get_run(parent_id_of(sweep_dir))
    runs = children(client, parent.info.run_id)
    means = {}
    for width in widths:
        group = [run for run in runs if run.data.tags["configuration"].endswith(f"dense_units={width}")]
        assert len(group) == 2, [run.data.tags["configuration"] for run in runs]
        means[width] = [sum(run.data.metrics[key] for run in group) / 2 for key in ("val_accuracy", "parameters")]
    assert means["16"][1] < means["64"][1] < 200_000 < means["256"][1]
    feasible = {width: values for width, values in means.items() if values[1] <= 200_000}
    front = [
        w for w, v in feasible.items() if not any(o[0] >= v[0] and o[1] <= v[1] and o != v for o in feasible.values())
    ]
    best = max(feasible, key=lambda width: feasible[width][0])

    rows = {row["configuration"].rpartition("=")[2]: row for row in summary_rows(sweep_dir, CSV_FILE)}
    assert sorted(width for width, row in rows.items() if row["pareto_front"] == "True") == sorted(front)
    assert rows["256"]["feasible"] == "False" and rows["256"]["compared_with_best"].startswith("infeasible")
    assert parent.data.tags["best_configuration"].endswith(f"dense_units={best}")
    assert sorted(item.rpartition("=")[2] for item in parent.data.tags["pareto_front"].split("; ")) == sorted(front)
    assert parent.data.tags["objectives"] == "val_accuracy:maximize,parameters:minimize"
    [version] = client.search_model_versions("name = 'synthetic'")
    assert client.get_run(version.run_id).data.tags["configuration"].endswith(f"dense_units={best}")
    markdown = (sweep_dir / MARKDOWN_FILE).read_text()
    assert "Pareto front over val_accuracy (higher is better) and parameters (lower is better)" in markdown
    assert (
        f"+model.dense_units=256 (parameters {means['256'][1]:.0f} > 200000)" in markdown.split("infeasible, never")[1]
    )
    assert 'id="pareto-front"' in (sweep_dir / REPORT_FILE).read_text()

    study = _study(sweep_dir)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    for trial in study.trials:
        width = str(trial.params["+model.dense_units"])
        assert trial.values == pytest.approx(means[width]), width
        assert (trial.constraints["parameters <= 200000"] > 0) == (width == "256")
    assert {str(trial.params["+model.dense_units"]) for trial in study.best_trials} == set(front)

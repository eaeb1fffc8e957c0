"""A sweep chooses on a validation split unless told otherwise: its jobs hold out dataset.validation_fraction (0.1
by default) drawn from one split seed, the summary, the parent's best_* metrics and the registration follow
val_accuracy, and the summary says what chose the winner (the test set, where asked or where the data cannot be
split)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.config import compose
from helpers.data import tfrecord_options, write_tfrecords
from helpers.presets import SWEEP_JOB
from helpers.sweeps import all_runs, children, client_for, parent_id_of, without_generated_line
from runner.data.validation import OPTIONAL_VARIABLE
from runner.sweeps.job.job import validation_of_job
from runner.sweeps.report.report import REPORT_FILE
from runner.sweeps.report.summary import MARKDOWN_FILE
from runner.sweeps.sweep_config import SweepConfig
from runner.sweeps.terms import CHOSEN_BY_TAG, PARENT_RUN_ID_FILE, what_chose

CONTEXT = "mlflow.data.context"
# SWEEP_JOB without its sweep.objective: the sweep's default.
DEFAULT_OBJECTIVE_JOB = [item for item in SWEEP_JOB if not item.startswith("sweep.objective=")]


def _validation(overrides: list[str], swept: str):
    return validation_of_job(SweepConfig.read(compose(overrides)), swept=swept)


def test_a_sweep_job_holds_out_the_default_fraction_from_one_split_seed_unless_told_otherwise():
    default = _validation(["seed=7"], swept="optimizer.lr")
    assert default.overrides == ("dataset.validation_fraction=0.1", "dataset.split_seed=7")
    assert default.environ == {OPTIONAL_VARIABLE: "1"} and default.fallback == "test_accuracy"
    # A sweep over `seed` itself still validates every job on one split: the schema's seed draws it.
    assert _validation(["seed=7"], swept="seed,batch").overrides[-1] == "dataset.split_seed=42"
    given = _validation(["dataset.validation_fraction=0.3", "dataset.split_seed=3"], swept="batch")
    assert given.overrides == () and given.environ == {}
    on_test = _validation(["sweep.objective=test_accuracy"], swept="batch")
    assert on_test.overrides == () and on_test.fallback is None  # trains on every training example, as asked
    # Asked for by name, a val_ objective over data that cannot be split is refused, not answered on test.
    asked = _validation(["sweep.objective=val_loss"], swept="batch")
    assert asked.overrides[0] == "dataset.validation_fraction=0.1" and asked.environ == {} and asked.fallback is None
    assert asked.chosen_by("val_loss", {"test_loss": 1.0}) is None
    assert default.chosen_by("val_accuracy", {"test_accuracy": 0.5}) == "test_accuracy"
    assert what_chose("test_accuracy", asked=True).startswith(
        "The test set chose the winner (test_accuracy), as sweep.objective=test_accuracy asks"
    )
    # Several objectives: any of them (or a constraint) on the validation split holds it out, whichever chooses.
    for asked_for in (
        ["sweep.objective=[parameters,val_accuracy]"],
        ["sweep.objective=[parameters,latency_ms]", "sweep.constraints=['val_accuracy >= 0.5']"],
    ):
        assert _validation(asked_for, swept="batch").overrides[0] == "dataset.validation_fraction=0.1", asked_for
    assert _validation(["sweep.objective=[parameters,test_accuracy]"], swept="batch").overrides == ()


def test_a_pruner_with_an_objective_of_the_end_suggests_the_validation_splits_per_epoch_one():
    """The fix names val_accuracy, never a test-set objective, which would make the winner's test score optimistic."""
    from omegaconf import OmegaConf

    from runner.errors import RunnerError
    from runner.sweeps.study.pruning import check_sweep
    from runner.sweeps.sweep_config import BASIC_SWEEPER, SweepConfig

    composed = OmegaConf.to_container(compose(["pruner=median", "sweep.objective=eval_accuracy"]), resolve=True)
    config = OmegaConf.create({**composed, "hydra": {"sweeper": {"_target_": BASIC_SWEEPER}}})
    with pytest.raises(RunnerError) as refused:
        check_sweep(config, SweepConfig.read(config))
    said = str(refused.value)
    assert said.startswith("sweep.objective='eval_accuracy' is not valid: pruner=median compares each epoch's")
    assert "e.g. sweep.objective=val_accuracy (" in said and "sweep.objective=test_" not in said


def _sweep(tmp_path, *overrides, without: str = "~"):
    """The sweep, from DEFAULT_OBJECTIVE_JOB less its items that start with `without` (its dataset, say)."""
    command = [
        sys.executable,
        "-m",
        "runner",
        "-m",
        *(item for item in DEFAULT_OBJECTIVE_JOB if not item.startswith(without)),
        f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *overrides,
    ]
    # The jobs' training processes import the tests' own dataset callables.
    tests = str(Path(__file__).resolve().parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_a_sweep_chooses_on_one_validation_split_and_says_so(tmp_path):
    result = _sweep(tmp_path, "optimizer.lr=0.001,0.003")
    assert result.returncode == 0, result.stderr[-3000:]
    client = client_for(tmp_path)
    parent_id = parent_id_of(tmp_path / "sweep")
    jobs = children(client, parent_id)
    assert len(jobs) == 2
    digests = set()
    for run in jobs:
        assert run.data.params["dataset.validation_fraction"] == "0.1" and run.data.params["dataset.split_seed"] == "42"
        assert run.data.tags[CHOSEN_BY_TAG] == "val_accuracy"
        assert [m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")] == [1]
        inputs = run.inputs.dataset_inputs
        validation = [item for item in inputs if any(t.value == "validation" for t in item.tags if t.key == CONTEXT)]
        assert len(validation) == 1
        digests.add(validation[0].dataset.digest)
    assert len(digests) == 1  # both configurations were validated on the same examples
    parent = client.get_run(parent_id)
    best = max(jobs, key=lambda run: run.data.metrics["val_accuracy"])
    assert parent.data.tags[CHOSEN_BY_TAG] == "val_accuracy"
    assert parent.data.metrics["best_val_accuracy"] == best.data.metrics["val_accuracy"]
    assert "best_test_accuracy" not in parent.data.metrics
    markdown = (tmp_path / "sweep" / MARKDOWN_FILE).read_text()
    assert markdown in result.stdout
    assert f"best val_accuracy: {best.data.metrics['val_accuracy']:.4f}" in markdown
    assert "The validation split chose the winner (val_accuracy); the test set was not used to choose" in markdown
    winner = "the winner's test metrics, mean ± standard deviation over its 1 run(s) and the 95% CI of the mean: "
    assert f"{winner}test_accuracy {best.data.metrics['test_accuracy']:.4f} n = 1: no interval, test_loss " in markdown


@pytest.mark.slow
def test_a_sweep_over_data_it_cannot_split_chooses_on_test_and_says_so(tmp_path):
    stream = ["dataset._target_=helpers.data.stream_with_validation", "dataset.name=stream"]
    result = _sweep(tmp_path, *stream, "dataset.with_validation=false", "optimizer.lr=0.001")
    assert result.returncode == 0, result.stderr[-3000:]
    client = client_for(tmp_path)
    parent = client.get_run(parent_id_of(tmp_path / "sweep"))
    [job] = children(client, parent.info.run_id)
    assert "val_accuracy" not in job.data.metrics and job.data.tags[CHOSEN_BY_TAG] == "test_accuracy"
    assert parent.data.tags[CHOSEN_BY_TAG] == "test_accuracy"
    assert parent.data.metrics["best_test_accuracy"] == job.data.metrics["test_accuracy"]
    said = "The test set chose the winner (test_accuracy), because the data has no validation split"
    assert said in (tmp_path / "sweep" / MARKDOWN_FILE).read_text() and said in result.stdout


def _learnable_npz(path, train: int, test: int, classes: int = 3) -> None:
    """Images whose class is a bright band at a place of its own, over noise: a CNN learns them in a few steps."""
    import numpy as np

    rng = np.random.default_rng(0)

    def split(count):
        labels = np.arange(count) % classes
        images = rng.integers(0, 64, (count, 28, 28), dtype=np.uint8)
        for label in range(classes):
            images[labels == label, 9 * label : 9 * label + 9, :] = 255
        return images, labels

    (x_train, y_train), (x_test, y_test) = split(train), split(test)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


@pytest.mark.slow
def test_k_fold_trains_each_fold_as_a_child_and_a_rerun_trains_only_the_unfinished_fold(tmp_path):
    """Two configurations by three folds, under joblib and MirroredStrategy: a child per fold, the folds partitioning
    the training examples the same way for both; the summary's mean is the folds' mean, the report's interval holds
    the folds' values and calls the learning rate that cannot learn worse than the best; a re-run trains only the
    fold that did not finish."""
    import json
    import statistics

    from helpers.sweeps import summary_rows
    from runner.sweeps.report.summary import CSV_FILE

    _learnable_npz(tmp_path / "data.npz", train=300, test=30)
    npz = ["dataset=npz", f"dataset.path={tmp_path / 'data.npz'}", "dataset.name=npz"]
    # Two jobs at once (joblib), each fold on two mirrored replicas of 16 (the global batch of 32).
    parallel = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "strategy=mirrored", "strategy.cpu_replicas=2"]
    overrides = [*npz, *parallel, "sweep.folds=3", "batch=16", "optimizer.lr=0.01,1e-9"]
    result = _sweep(tmp_path, *overrides, without="dataset=")
    assert result.returncode == 0, result.stderr[-3000:]
    client = client_for(tmp_path)
    parent_id = parent_id_of(tmp_path / "sweep")
    runs = children(client, parent_id)
    by_configuration: dict[str, list] = {}
    for run in sorted(runs, key=lambda run: run.data.tags["fold"]):
        by_configuration.setdefault(run.data.tags["configuration"], []).append(run)
    assert sorted(by_configuration) == ["optimizer.lr=0.01", "optimizer.lr=1e-09"]
    partitions = []
    for folds in by_configuration.values():
        assert [run.data.tags["fold"] for run in folds] == ["0", "1", "2"]
        assert [run.info.run_name.rpartition(",")[2] for run in folds] == ["fold=0", "fold=1", "fold=2"]
        held = []
        for run in folds:
            assert run.data.params["dataset.folds"] == "3" and run.data.params["dataset.split_seed"] == "42"
            assert run.data.params["num_replicas"] == "2" and run.data.tags["launcher"] == "joblib"
            path = client.download_artifacts(run.info.run_id, "validation_split.json", str(tmp_path))
            held.append(json.loads(open(path).read())["examples"])
        # The folds partition the training examples (the preset's dataset.train_examples=256 of the file's 300).
        assert sorted(sum(held, [])) == list(range(256))
        partitions.append(held)
    assert partitions[0] == partitions[1]  # the same folds for every configuration: the comparison is paired
    rows = {row["configuration"]: row for row in summary_rows(tmp_path / "sweep", CSV_FILE)}
    for name, folds in by_configuration.items():
        mean = statistics.fmean(run.data.metrics["val_accuracy"] for run in folds)
        assert rows[name]["n"] == "3" and float(rows[name]["val_accuracy_mean"]) == mean
    good = by_configuration["optimizer.lr=0.01"]
    assert client.get_run(parent_id).data.metrics["best_val_accuracy_mean"] == statistics.fmean(
        run.data.metrics["val_accuracy"] for run in good
    )
    assert rows["optimizer.lr=1e-09"]["compared_with_best"].startswith("worse than the best"), rows
    folds = good

    # Fold 1 killed: the re-run trains it alone.
    client.set_terminated(folds[1].info.run_id, "KILLED")
    again = _sweep(tmp_path, *overrides, without="dataset=")
    assert again.returncode == 0, again.stderr[-3000:]
    said = again.stdout + again.stderr
    assert f",fold=0) already FINISHED as MLflow run {folds[0].info.run_id}: skipped" in said
    assert f",fold=1): continuing MLflow run {folds[1].info.run_id}" in said
    assert client.get_run(folds[1].info.run_id).info.status == "FINISHED"

    # The sweep's report, in its directory and on its parent run: the configuration's interval holds each fold's value.
    report = (tmp_path / "sweep" / REPORT_FILE).read_text()
    assert REPORT_FILE in {item.path for item in client.list_artifacts(parent_id)}
    row = {row["configuration"]: row for row in summary_rows(tmp_path / "sweep", CSV_FILE)}["optimizer.lr=0.01"]
    values = [client.get_run(run.info.run_id).data.metrics["val_accuracy"] for run in folds]
    assert len(set(values)) == 1  # its folds agree (the bands are easy to learn)
    assert float(row["val_accuracy_ci95_low"]) <= min(values) <= max(values) <= float(row["val_accuracy_ci95_high"])
    assert "worse than the best" in report
    # Rebuilt from the MLflow store alone, in an empty directory: the same page, but for its Generated line.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rebuilt = subprocess.run(
        [sys.executable, "-m", "runner.report", parent_id, "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert without_generated_line((elsewhere / REPORT_FILE).read_text()) == without_generated_line(report)


@pytest.mark.slow
def test_data_that_cannot_be_cut_into_the_folds_is_refused_before_the_sweep_starts(tmp_path):
    """The sweep loads its data once before its parent run: 3 TFRecord files cannot make 5 folds, and a tf.data
    callable cannot be folded at all. Each is one paragraph, exit 2, and no MLflow run."""
    write_tfrecords(tmp_path, "train", files=3, per_file=10)
    write_tfrecords(tmp_path, "test", files=1, per_file=4)
    cases = {
        "files": ([*tfrecord_options(tmp_path), "dataset.name=records", "sweep.folds=5"], "3 files"),
        "stream": (
            [
                "dataset._target_=helpers.data.stream_with_validation",
                "dataset.name=stream",
                "sweep.folds=2",
            ],
            "cannot split into folds",
        ),
    }
    for name, (overrides, why) in cases.items():
        case = tmp_path / name
        case.mkdir()
        result = _sweep(case, *overrides, "optimizer.lr=0.001,0.002", without="dataset=" if name == "files" else "~")
        assert result.returncode == 2, result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert line.startswith(f"error: dataset.folds={5 if name == 'files' else 2} (sweep.folds) is not valid"), line
        assert why in line and "Fix:" in line
        assert not (case / "sweep" / PARENT_RUN_ID_FILE).exists()
        assert all_runs(client_for(case)) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy",
    [
        ["strategy=parameter_server", "cluster=local", "loop.steps_per_epoch=4"],
        ["strategy=central_storage", "strategy.cpu_replicas=2", "batch=16"],
    ],
    ids=["parameter_server", "central_storage"],
)
def test_k_fold_trains_each_fold_under_the_other_strategies(tmp_path, strategy):
    """sweep.folds=2 with a parameter-server cluster (the coordinator's validation pass) and with central storage:
    a FINISHED child per fold, each validated on its own fold, the two folds partitioning the training examples."""
    import json

    result = _sweep(tmp_path, *strategy, "sweep.folds=2", "optimizer.lr=0.001")
    assert result.returncode == 0, result.stderr[-3000:]
    client = client_for(tmp_path)
    folds = sorted(children(client, parent_id_of(tmp_path / "sweep")), key=lambda run: run.data.tags["fold"])
    assert [(run.data.tags["fold"], run.info.status) for run in folds] == [("0", "FINISHED"), ("1", "FINISHED")]
    held = []
    for run in folds:
        assert run.data.params["strategy.name"] == strategy[0].partition("=")[2]
        assert 0.0 <= run.data.metrics["val_accuracy"] <= 1.0
        path = client.download_artifacts(run.info.run_id, "validation_split.json", str(tmp_path))
        held.append(json.loads(open(path).read())["examples"])
    assert sorted(held[0] + held[1]) == list(range(256))  # the preset's dataset.train_examples

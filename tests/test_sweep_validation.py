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
from helpers.presets import SWEEP_JOB
from helpers.sweeps import children, client_for, parent_id_of
from runner.data.validation import OPTIONAL_VARIABLE
from runner.sweeps.job import validation_of_job
from runner.sweeps.summary import MARKDOWN_FILE
from runner.sweeps.terms import CHOSEN_BY_TAG, what_chose

CONTEXT = "mlflow.data.context"
# SWEEP_JOB without its sweep.objective: the sweep's default.
DEFAULT_OBJECTIVE_JOB = [item for item in SWEEP_JOB if not item.startswith("sweep.objective=")]


def test_a_sweep_job_holds_out_the_default_fraction_from_one_split_seed_unless_told_otherwise():
    default = validation_of_job(compose(["seed=7"]), swept="optimizer.lr")
    assert default.overrides == ("dataset.validation_fraction=0.1", "dataset.split_seed=7")
    assert default.environ == {OPTIONAL_VARIABLE: "1"} and default.fallback == "test_accuracy"
    # A sweep over `seed` itself still validates every job on one split: the schema's seed draws it.
    assert validation_of_job(compose(["seed=7"]), swept="seed,batch").overrides[-1] == "dataset.split_seed=42"
    given = validation_of_job(compose(["dataset.validation_fraction=0.3", "dataset.split_seed=3"]), swept="batch")
    assert given.overrides == () and given.environ == {}
    on_test = validation_of_job(compose(["sweep.objective=test_accuracy"]), swept="batch")
    assert on_test.overrides == () and on_test.fallback is None  # trains on every training example, as asked
    # Asked for by name, a val_ objective over data that cannot be split is refused, not answered on test.
    asked = validation_of_job(compose(["sweep.objective=val_loss"]), swept="batch")
    assert asked.overrides[0] == "dataset.validation_fraction=0.1" and asked.environ == {} and asked.fallback is None
    assert asked.chosen_by("val_loss", {"test_loss": 1.0}) is None
    assert default.chosen_by("val_accuracy", {"test_accuracy": 0.5}) == "test_accuracy"
    assert what_chose("test_accuracy", asked=True).startswith(
        "The test set chose the winner (test_accuracy), as sweep.objective=test_accuracy asks"
    )


def _sweep(tmp_path, *overrides):
    command = [
        sys.executable,
        "-m",
        "runner",
        "-m",
        *DEFAULT_OBJECTIVE_JOB,
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
    assert f"the winner's test metrics: test_accuracy {best.data.metrics['test_accuracy']:.4f}" in markdown


@pytest.mark.slow
def test_a_sweep_over_data_it_cannot_split_chooses_on_test_and_says_so(tmp_path):
    stream = ["dataset._target_=test_validation_split.stream_with_validation", "dataset.name=stream"]
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

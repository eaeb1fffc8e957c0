"""The Model Registry: two real sweeps where the second is worse (versions 1 and 2, `champion` stays on 1,
and loads from models:/<name>@champion), the alias rules, and registrations racing in parallel
processes against one real store."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.presets import WITH_MODEL
from helpers.registry import assert_parallel_registrations_settled, make_runs_with_models, register_in_parallel
from helpers.sweeps import sweep
from helpers.tracking import load_model, mlflow_client
from runner.sweeps.terms import PARENT_RUN_ID_FILE
from runner.tracking.registry import CHAMPION, champion_version, register_run_model

NAME = "synthetic"  # conf/config.yaml's mlflow.registered_model_name: the dataset's name


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory):
    """A sweep that trains, then one whose only job barely moves its initial weights (lr 1e-7):
    (workdir, [parent ids], [stdout])."""
    workdir = tmp_path_factory.mktemp("registry")
    parents, outputs = [], []
    for name, lr in (("good", "0.001"), ("worse", "1e-7")):
        done = sweep(workdir, workdir / name, "dataset.train_examples=512", f"optimizer.lr={lr}", WITH_MODEL)
        assert done.returncode == 0, done.stderr[-3000:]
        parents.append((workdir / name / PARENT_RUN_ID_FILE).read_text().strip())
        outputs.append(done.stdout)
    return workdir, parents, outputs


@pytest.mark.slow
def test_a_worse_sweep_registers_a_version_and_leaves_the_champion(two_sweeps):
    workdir, parents, outputs = two_sweeps
    client = mlflow_client(f"sqlite:///{workdir}/mlflow.db")
    versions = sorted(client.search_model_versions(f"name = '{NAME}'"), key=lambda version: int(version.version))
    assert [int(version.version) for version in versions] == [1, 2]
    first, second = versions
    for version, parent in zip(versions, parents, strict=True):
        assert version.tags["sweep_parent_run_id"] == parent
        [child] = client.search_runs(
            [client.get_run(parent).info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'"
        )
        assert version.run_id == child.info.run_id
        assert float(version.tags["objective_value"]) == child.data.metrics["test_accuracy"]
        assert (version.tags["objective"], version.tags["objective_direction"]) == ("test_accuracy", "maximize")
        assert client.get_run(parent).data.tags["registered_model_version"] == f"{NAME}/{version.version}"
    assert float(second.tags["objective_value"]) < float(first.tags["objective_value"])
    assert int(champion_version(client, NAME).version) == 1
    assert "now @champion" in outputs[0] and "@champion stays on version 1" in outputs[1]


@pytest.mark.slow
def test_a_sweep_with_a_failed_job_registers_no_model(tmp_path):
    """Its best so far may not be the sweep's best once the rest finish, and @champion, once there, would stay."""
    done = sweep(tmp_path, tmp_path / "sweep", "resume=never", "batch=32,0", WITH_MODEL)
    assert done.returncode != 0 and "1 of 2 sweep jobs failed: job 1 (batch=0)" in done.stderr
    assert "best job of that configuration: job 0" in done.stdout  # there is a best, and it is not registered
    assert "1 of 2 jobs did not finish, so no model is registered yet" in done.stdout
    client = mlflow_client(f"sqlite:///{tmp_path}/mlflow.db")
    assert client.search_registered_models() == []
    parent = client.get_run((tmp_path / "sweep" / PARENT_RUN_ID_FILE).read_text().strip())
    assert "registered_model_version" not in parent.data.tags


@pytest.mark.slow
def test_the_champion_loads_from_the_registry(two_sweeps):
    workdir, _, _ = two_sweeps
    model = load_model(f"sqlite:///{workdir}/mlflow.db", f"models:/{NAME}@{CHAMPION}")
    images = np.random.default_rng(0).integers(0, 256, (4, 28, 28)).astype(np.uint8)
    probabilities = np.asarray(model.predict(images))
    assert probabilities.shape == (4, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.slow
def test_parallel_registrations_lose_no_version_and_crown_the_best(tmp_path):
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow_client(tracking_uri).search_experiments()  # create the store's schema before the race
    values = [0.61, 0.93, 0.75]
    run_ids = register_in_parallel(tracking_uri, NAME, values)
    assert_parallel_registrations_settled(tracking_uri, NAME, values, run_ids)


def test_champion_moves_only_to_a_strictly_better_version_of_its_objective(tmp_path):
    client = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = make_runs_with_models(client, 5)

    said = []

    def register(run: int, value: float, objective: str = "test_accuracy"):
        registration = register_run_model(
            client, NAME, runs[run], objective, value, lower_is_better=objective.endswith("loss")
        )
        said.append(registration.describe())
        return registration.version, int(registration.champion.version)

    assert register(0, 0.80) == (1, 1)
    assert register(1, 0.70) == (2, 1)  # worse: champion stays
    assert register(2, 0.10, "test_loss") == (3, 1)  # another objective never displaces it
    assert register(3, 0.80) == (4, 1)  # a tie keeps it
    assert register(4, 0.85) == (5, 5)  # strictly better takes it
    # Each says why the champion stayed: what was compared.
    stays = "@champion stays on version 1"
    assert said[0] == f"registered models:/{NAME}/1, now @champion"
    assert said[1] == (
        f"registered models:/{NAME}/2, {stays} because its test_accuracy 0.8 is better than or equal to this "
        "version's 0.7 (higher is better; the alias moves only to a strictly better version)"
    )
    assert said[2] == (
        f"registered models:/{NAME}/3, {stays} (test_accuracy 0.8): versions compare only on the champion's "
        "objective, test_accuracy (maximize), and this version was chosen by test_loss (minimize)"
    )
    assert f"{stays} because its test_accuracy 0.8 is better than or equal to this version's 0.8 " in said[3]
    again = register_run_model(client, NAME, runs[0], "test_accuracy", 0.80, lower_is_better=False)
    assert (again.version, again.created, int(again.champion.version)) == (1, False, 5)  # a run registers once
    assert len(client.search_model_versions(f"name = '{NAME}'")) == 5


def test_a_run_without_its_model_is_refused_with_the_fix(tmp_path):
    from runner.errors import RunnerError

    client = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    with pytest.raises(RunnerError, match=f"MLflow run {run_id} has no model to register.*Fix: re-run"):
        register_run_model(client, NAME, run_id, "test_accuracy", 0.5, lower_is_better=False)

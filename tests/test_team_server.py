"""A team's tracking server for real: PostgreSQL as the backend store, `mlflow server` proxying artifacts
to a local directory, `python -m runner mlflow.tracking_uri=http://...` training and sweeping against
it, and the MLflow UI in headless Chromium showing what was tracked."""

from __future__ import annotations

import filecmp

import psycopg2
import pytest

from helpers.browser import Chromium
from helpers.cli import run_cli
from helpers.presets import SWEEP_JOB, WITH_MODEL
from helpers.requires import requires
from helpers.servers import MlflowServer, Postgres
from helpers.tracking import metric_history, mlflow_client

pytestmark = [pytest.mark.slow, pytest.mark.server, requires("postgresql")]

# Two epochs, with the MLflow Model the server stores.
SHORT = [*SWEEP_JOB, "epochs=2", WITH_MODEL]
EXPERIMENT = "fashion_mnist"  # conf/config.yaml's mlflow.experiment_name
PARENT_TAG = "mlflow.parentRunId"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("team")


@pytest.fixture(scope="module")
def postgres(workdir):
    server = Postgres(log_copy=workdir / "postgres.log")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def mlflow_server(postgres, workdir):
    server = MlflowServer(postgres.uri, artifacts=workdir / "artifacts", log=workdir / "mlflow-server.log")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(mlflow_server):
    return mlflow_client(mlflow_server.url)


@pytest.fixture(scope="module")
def experiment_id(client, training_run):
    return client.get_experiment_by_name(EXPERIMENT).experiment_id


@pytest.fixture(scope="module")
def training_run(mlflow_server, workdir) -> str:
    """The id of one short training job's run, tracked on the server."""
    done = run_cli(*SHORT, f"mlflow.tracking_uri={mlflow_server.url}", f"hydra.run.dir={workdir / 'run'}", cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    return (workdir / "run" / "mlflow_run_id.txt").read_text().strip()


@pytest.fixture(scope="module")
def sweep(mlflow_server, client, training_run, workdir):
    """A 2-job sweep against the server: (parent run, [child runs]) as the server holds them."""
    done = run_cli(
        "-m",
        "batch=32,64",
        *SHORT,
        f"mlflow.tracking_uri={mlflow_server.url}",
        f"hydra.sweep.dir={workdir / 'sweep'}",
        cwd=workdir,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
    # The store is fresh: besides the training job, it holds exactly what the sweep created.
    runs = [run for run in client.search_runs([experiment]) if run.info.run_id != training_run]
    children = [run for run in runs if PARENT_TAG in run.data.tags]
    parents = [run for run in runs if PARENT_TAG not in run.data.tags]
    assert len(parents) == 1, [run.info.run_name for run in runs]
    return parents[0], sorted(children, key=lambda run: int(run.data.params["batch"]))


def test_a_training_run_is_tracked_in_postgres_with_artifacts_in_the_servers_directory(
    client, training_run, postgres, workdir
):
    run = client.get_run(training_run)
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert (params["strategy.name"], params["dataset.name"], params["epochs"]) == ("one_device", "synthetic", "2")
    assert (params["num_replicas"], params["global_batch_size"]) == ("1", "64")
    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "learning_rate"):
        assert [step for step, _ in metric_history(client, training_run, key)] == [1, 2], key
    assert "eval_accuracy" in run.data.metrics

    # Artifacts go through the server (mlflow-artifacts:) into its --artifacts-destination, intact.
    assert run.info.artifact_uri.startswith("mlflow-artifacts:")
    checkpoints = {item.path.split("/")[-1] for item in client.list_artifacts(training_run, "checkpoints")}
    indexes = sorted((name for name in checkpoints if name.endswith(".index")), key=lambda name: int(name[5:-6]))
    assert "checkpoint" in checkpoints and indexes, checkpoints
    assert any(name.startswith(indexes[-1].removesuffix(".index") + ".data-") for name in checkpoints), checkpoints
    local = workdir / "run" / "checkpoints"
    stored = workdir / "artifacts" / run.info.experiment_id / training_run / "artifacts" / "checkpoints"
    for name in checkpoints:
        assert filecmp.cmp(stored / name, local / name, shallow=False), name
    downloaded = client.download_artifacts(training_run, f"checkpoints/{indexes[-1]}", str(workdir / "download"))
    assert filecmp.cmp(downloaded, local / indexes[-1], shallow=False)

    # The server really keeps runs in PostgreSQL, not in a store of its own.
    with (
        psycopg2.connect(
            host="127.0.0.1",
            port=postgres.port,
            user=postgres.role,
            password=postgres.password,
            dbname=postgres.database,
        ) as connection,
        connection.cursor() as cursor,
    ):
        cursor.execute("SELECT status FROM runs WHERE run_uuid = %s", (training_run,))
        assert cursor.fetchall() == [("FINISHED",)]
    connection.close()


def test_a_sweep_is_one_parent_run_with_a_child_run_per_job(sweep):
    parent, children = sweep
    assert [child.data.params["batch"] for child in children] == ["32", "64"]
    assert {child.data.tags[PARENT_TAG] for child in children} == {parent.info.run_id}
    assert {child.info.experiment_id for child in children} == {parent.info.experiment_id}
    assert [child.info.status for child in children] == ["FINISHED", "FINISHED"]
    assert all("test_accuracy" in child.data.metrics for child in children)
    assert parent.info.status == "FINISHED"


@requires("chromium")
def test_the_ui_lists_the_run_and_the_sweep_parent_with_its_children(
    mlflow_server, client, experiment_id, training_run, sweep, workdir
):
    parent, children = sweep
    names = {
        run_id: client.get_run(run_id).info.run_name
        for run_id in (training_run, parent.info.run_id, *(child.info.run_id for child in children))
    }
    row = "document.querySelector('[row-id=\"{}\"]') !== null".format
    browser = Chromium(user_data_dir=workdir / "chromium-profile", log=workdir / "chromium.log")
    try:
        browser.open(f"{mlflow_server.url}/#/experiments/{experiment_id}/runs")
        browser.wait_for(f"{row(training_run)} && {row(parent.info.run_id)}")
        # Nested: the jobs are not top-level rows, they sit under the parent until it is expanded.
        assert not any(browser.evaluate(row(child.info.run_id)) for child in children)
        browser.screenshot(workdir / "runs-collapsed.png")
        browser.click(f'[row-id="{parent.info.run_id}"] [col-id*="Run Name"] button')
        browser.wait_for(" && ".join(row(child.info.run_id) for child in children))
        shown = browser.text()
        browser.screenshot(workdir / "runs-expanded.png")
    finally:
        browser.close()
    for _run_id, name in names.items():
        assert name in shown, (name, shown[:3000])


def test_the_sweep_registers_its_best_job_and_parallel_registrations_settle_on_the_server(client, sweep, mlflow_server):
    from helpers.registry import assert_parallel_registrations_settled, register_in_parallel

    parent, children = sweep
    [version] = client.search_model_versions("name = 'synthetic'")  # conf's registered_model_name: the dataset's
    best = max(child.data.metrics["test_accuracy"] for child in children)
    assert float(version.tags["objective_value"]) == best
    assert version.run_id in {child.info.run_id for child in children if child.data.metrics["test_accuracy"] == best}
    assert version.tags["sweep_parent_run_id"] == parent.info.run_id
    assert client.get_model_version_by_alias("synthetic", "champion").version == version.version

    values = [0.61, 0.93, 0.75]
    run_ids = register_in_parallel(mlflow_server.url, "parallel", values)
    assert_parallel_registrations_settled(mlflow_server.url, "parallel", values, run_ids)

"""The team server behind MLflow's basic-auth app, its users in PostgreSQL: no credentials, a wrong password and
a READ-only user each stop before training with one paragraph (401 or 403), exit status 2 and no run; a user
with EDIT sweeps and trains as usual; no password ever lands in a run, a log, a config or an error."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from helpers.cli import run_cli
from helpers.presets import TINY, WITH_MODEL
from helpers.requires import requires
from helpers.servers import BasicAuth, MlflowServer, Postgres
from helpers.tracking import as_user, mlflow_client

pytestmark = [pytest.mark.slow, pytest.mark.server, requires("postgresql")]

EXPERIMENT = "fashion_mnist"  # conf/config.yaml's mlflow.experiment_name
MODEL = "synthetic"  # its mlflow.registered_model_name: the dataset's name
ADMIN = BasicAuth(database_uri="", admin_password="admin-test-password")
READER = ("reader", "reader-secret-password")
TRAINER = ("trainer", "trainer-secret-password")
COLLEAGUE = ("colleague", "colleague-secret-password")  # EDIT on the experiment, nothing on the trainer's model
PASSWORDS = (ADMIN.admin_password, READER[1], TRAINER[1], COLLEAGUE[1], "wrong-secret-password")
# Each refusal comes before TensorFlow is imported: far quicker than any training run.
REFUSAL_SECONDS = 60


def _credentials(user: str, password: str) -> dict[str, str]:
    return {"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("team-auth")


@pytest.fixture(scope="module")
def server(workdir):
    """An auth-enabled server whose admin created the experiment, a READ-only user and an EDIT user."""
    postgres = Postgres(log_copy=workdir / "postgres.log")
    mlflow_server = None
    try:
        postgres.start()
        auth = BasicAuth(postgres.create_database("mlflow_auth"), admin_password=ADMIN.admin_password)
        mlflow_server = MlflowServer(
            postgres.uri, artifacts=workdir / "artifacts", log=workdir / "mlflow-server.log", auth=auth
        ).start()
        from mlflow.server import get_app_client

        with as_user(ADMIN.admin_username, ADMIN.admin_password):
            experiment_id = mlflow_client(mlflow_server.url).create_experiment(EXPERIMENT)
            users = get_app_client("basic-auth", tracking_uri=mlflow_server.url)
            for (name, password), permission in ((READER, "READ"), (TRAINER, "EDIT"), (COLLEAGUE, "EDIT")):
                users.create_user(name, password)
                users.grant_user_permission(name, "experiment", experiment_id, permission)
        yield mlflow_server
    finally:
        if mlflow_server is not None:
            mlflow_server.stop()
        postgres.stop()


def _runs(server) -> list:
    with as_user(ADMIN.admin_username, ADMIN.admin_password):
        client = mlflow_client(server.url)
        return client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])


def _refused(server, workdir: Path, name: str, *args: str, env: dict[str, str]) -> str:
    """Run the CLI as the given user; assert exit 2, one paragraph, no run, no password; return the paragraph."""
    started = time.monotonic()
    done = run_cli(
        *args,
        *TINY,
        "strategy=one_device",
        f"mlflow.tracking_uri={server.url}",
        f"hydra.run.dir={workdir / name}",
        f"hydra.sweep.dir={workdir / name}",
        cwd=workdir,
        env=env,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert time.monotonic() - started < REFUSAL_SECONDS
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr[-3000:]
    assert not any(password in done.stdout + done.stderr for password in PASSWORDS)
    assert _runs(server) == []
    return errors[0]


def test_no_credentials_is_401_with_the_variables_to_set(server, workdir):
    message = _refused(server, workdir, "anonymous", env={})
    assert "requires a login (401 Unauthorized) and no credentials are set" in message
    assert "export MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in message


def test_a_wrong_password_is_401_naming_the_user(server, workdir):
    message = _refused(server, workdir, "wrong", env=_credentials(TRAINER[0], "wrong-secret-password"))
    assert "rejected the credentials of user 'trainer' (401 Unauthorized)" in message


@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_a_read_only_user_is_403_before_any_run_or_sweep_parent(server, workdir, sweep):
    message = _refused(
        server, workdir, f"reader-{sweep}", *(["-m", "batch=32,64"] if sweep else []), env=_credentials(*READER)
    )
    assert "would refuse to create the run for user 'reader' (403 Forbidden)" in message
    assert "it has READ permission on experiment 'fashion_mnist'" in message
    assert "grant 'reader' EDIT on the experiment" in message


def test_credentials_in_the_tracking_uri_are_refused_and_never_written(server, workdir):
    embedded = server.url.replace("http://", f"http://{TRAINER[0]}:{TRAINER[1]}@")
    (workdir / "embedded").mkdir()
    done = run_cli(*TINY, f"mlflow.tracking_uri={embedded}", cwd=workdir / "embedded", env={})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "embeds a password" in done.stderr and "MLFLOW_TRACKING_PASSWORD" in done.stderr
    assert TRAINER[1] not in done.stdout + done.stderr
    assert list((workdir / "embedded").iterdir()) == []  # refused before Hydra wrote the run directory


def test_an_editor_sweeps_and_trains_and_no_password_is_recorded_anywhere(server, workdir):
    sweep_dir = workdir / "editor"
    # One job: it trains in its own `python -m runner`, logs its model, and the sweep registers it.
    done = run_cli(
        "-m",
        "batch=32",
        *TINY,
        WITH_MODEL,
        "strategy=one_device",
        "mlflow.system_metrics.interval_seconds=1",
        f"mlflow.tracking_uri={server.url}",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=workdir,
        env=_credentials(*TRAINER),
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = _runs(server)
    assert sorted(run.info.status for run in runs) == ["FINISHED", "FINISHED"]  # the sweep's parent and its job
    child = next(run for run in runs if "mlflow.parentRunId" in run.data.tags)
    assert "eval_accuracy" in child.data.metrics
    # A sweep job holds out a validation split, which it chooses on (docs/sweeps.md).
    names = {item.dataset.name for item in child.inputs.dataset_inputs}
    assert names == {"synthetic-train", "synthetic-validation", "synthetic-test"}
    with as_user(*TRAINER):
        champion = mlflow_client(server.url).get_model_version_by_alias(MODEL, "champion")
    assert champion.run_id == child.info.run_id  # the sweep registered it, as the editor

    recorded = [done.stdout, done.stderr]
    with as_user(*TRAINER):
        client = mlflow_client(server.url)
        for run in runs:
            recorded += [*run.data.params.values(), *run.data.tags.values(), run.info.run_name]
            for artifact in ("config.yaml", "overrides.yaml", "sweep_summary.md", "sweep_summary.csv"):
                if artifact in {item.path for item in client.list_artifacts(run.info.run_id)}:
                    recorded.append(
                        Path(
                            client.download_artifacts(run.info.run_id, artifact, str(workdir / "downloads"))
                        ).read_text()
                    )
    recorded += [
        path.read_text(errors="replace")
        for path in sweep_dir.rglob("*")
        if path.is_file() and path.suffix in (".log", ".yaml", ".txt", ".json", ".md", ".csv")
    ]
    assert len(recorded) > 10
    for text in recorded:
        assert not any(password in text for password in PASSWORDS), text[:500]


def test_a_colleague_who_may_not_add_versions_of_the_model_is_refused_before_training(server, workdir):
    """The trainer's sweep above created the registered model, so the trainer manages it: the colleague, who may
    edit the experiment, would train for nothing and get 403 at registration. Refused before anything runs."""
    with as_user(*TRAINER):
        mlflow_client(server.url).get_registered_model(MODEL)  # the editor's sweep registered it
    before = len(_runs(server))
    started = time.monotonic()
    done = run_cli(
        *TINY,
        WITH_MODEL,
        "strategy=one_device",
        "mlflow.register=true",
        f"mlflow.tracking_uri={server.url}",
        f"hydra.run.dir={workdir / 'colleague'}",
        cwd=workdir,
        env=_credentials(*COLLEAGUE),
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert time.monotonic() - started < REFUSAL_SECONDS
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert "would refuse to register this run's model for user 'colleague' (403 Forbidden)" in error
    assert f"grant 'colleague' EDIT on the registered model '{MODEL}'" in error
    assert len(_runs(server)) == before
    assert COLLEAGUE[1] not in done.stdout + done.stderr

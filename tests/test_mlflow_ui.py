"""The MLflow UI opens where a training user expects: the run's log gives the `mlflow ui` command for its sqlite
store and the link to the experiment's runs table; that command, run as written, and that link, opened in
headless Chromium, land on the runs table with the run in it (not MLflow 3's GenAI view, "Traces"), and the
experiment's Models tab lists the run's LoggedModels."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.browser import Chromium
from helpers.cli import run_cli
from helpers.presets import TWO_EPOCHS, WITH_MODEL
from helpers.processes import stop_group
from helpers.requires import requires
from helpers.servers import answers, free_port
from helpers.tracking import metric_history, mlflow_client
from helpers.waiting import exited, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.server, requires("chromium")]

LINE = re.compile(
    r"MLflow UI: `(mlflow ui --backend-store-uri \S+)`, then (http://127\.0\.0\.1:5000/\S+) "
    r"\(the run: (http://127\.0\.0\.1:5000/\S+)\)"
)


def _serve(command: str, port: int, cwd: Path) -> subprocess.Popen:
    """The log's `mlflow ui` command on another port (the default 5000 may be taken), answering /health."""
    mlflow = str(Path(sys.executable).parent / "mlflow")
    args = shlex.split(command)
    assert args[0] == "mlflow"
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    log = cwd / "mlflow-ui.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [mlflow, *args[1:], "--host", "127.0.0.1", "--port", str(port)],
            cwd=cwd,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    wait_for(
        lambda: answers(f"http://127.0.0.1:{port}/health"),
        120,
        "the MLflow UI to answer /health",
        every=0.5,
        unless=exited(process, "mlflow ui"),
        detail=lambda: log.read_text()[-3000:],
    )
    return process


def test_the_logged_ui_link_opens_the_runs_table_with_the_run_and_its_models(tmp_path):
    """... and the experiment's Models tab lists the run's model and each epoch's checkpoint model
    (mlflow.log_every_checkpoint) with their metrics."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = run_cli(
        *TWO_EPOCHS,
        "strategy=one_device",
        WITH_MODEL,
        "mlflow.log_every_checkpoint=true",
        "checkpoint.every_epochs=1",
        f"mlflow.tracking_uri={store}",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr
    found = LINE.search(output)
    assert found, output[-3000:]
    command, table, run_page = found.groups()
    run_id = (tmp_path / "run" / "mlflow_run_id.txt").read_text().strip()
    client = mlflow_client(store)
    experiment = client.get_experiment(client.get_run(run_id).info.experiment_id)
    assert command == f"mlflow ui --backend-store-uri {store}"
    assert table.endswith(f"/#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning")
    assert run_page.endswith(f"/#/experiments/{experiment.experiment_id}/runs/{run_id}")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"

    port = free_port()
    server = _serve(command, port, tmp_path)  # from another directory than the run's: the path is absolute
    browser = Chromium(user_data_dir=tmp_path / "chromium-profile", log=tmp_path / "chromium.log")
    try:
        browser.open(table.replace(":5000/", f":{port}/"))
        browser.wait_for(f"!!document.querySelector('[row-id=\"{run_id}\"]')", timeout=90)
        browser.screenshot(tmp_path / "runs-table.png")
        assert "No data available" not in browser.text()
        browser.open(run_page.replace(":5000/", f":{port}/"))
        browser.wait_for(f"document.body && document.body.innerText.includes({run_id!r})", timeout=90)
        # The experiment's Models tab: the run's model and its checkpoints'.
        models_page = table.replace(":5000/", f":{port}/").replace("/runs?", "/models?")
        browser.open(models_page)
        browser.wait_for("document.body && document.body.innerText.includes('checkpoint-2')", timeout=90)
        browser.screenshot(tmp_path / "models.png")
        page = browser.text()
        assert all(name in page for name in ("model", "checkpoint-1", "checkpoint-2")), page[-3000:]
        # A checkpoint's page: its epoch's metrics (step 1's test_loss, not step 2's).
        [first] = client.search_logged_models([experiment.experiment_id], filter_string="name = 'checkpoint-1'")
        browser.open(models_page.split("?")[0] + f"/{first.model_id}")
        browser.wait_for("document.body && document.body.innerText.includes('test_loss')", timeout=90)
        page = browser.text()
        (_, epoch_1), (_, epoch_2) = metric_history(client, run_id, "test_loss")
        assert "checkpoint-1" in page and str(epoch_1) in page and str(epoch_2) not in page, page[-3000:]
    finally:
        browser.close()
        stop_group(server)

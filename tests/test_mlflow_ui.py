"""The MLflow UI opens where a training user expects: the run's log gives the `mlflow ui` command for its sqlite
store and the link to the experiment's runs table; that command, run as written, and that link, opened in
headless Chromium, land on the runs table with the run in it (not MLflow 3's GenAI view, "Traces")."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from helpers.browser import Chromium
from helpers.cli import run_cli
from helpers.presets import TINY
from helpers.processes import stop_group
from helpers.requires import requires
from helpers.servers import free_port
from helpers.tracking import mlflow_client

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
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return process
        except OSError:
            pass
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)


def test_the_logged_ui_link_opens_the_runs_table_with_the_run(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = run_cli(
        *TINY, "strategy=one_device", f"mlflow.tracking_uri={store}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path
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
    finally:
        browser.close()
        stop_group(server)

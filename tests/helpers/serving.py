"""A logged model served by the documented `mlflow models serve` command (docs/tracking-and-models.md, "The logged
model"), and asked for predictions over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers.config import REPO
from helpers.processes import stop_group
from helpers.servers import answers, free_port
from helpers.waiting import exited, wait_for

# The page that documents serving a run's logged model.
SERVING_PAGE = REPO / "docs" / "tracking-and-models.md"


def documented_serve_command(model_uri: str, port: int) -> str:
    """The documented serve command for runs:/..., exactly as written there, with the run id and port filled in."""
    page = SERVING_PAGE.read_text()
    [line] = [line for line in page.splitlines() if "mlflow models serve -m runs:/<run id>/model" in line]
    assert "--port 5001" in line
    return line.replace("runs:/<run id>/model", model_uri).replace("--port 5001", f"--port {port}")


def post_invocations(url: str, body: dict) -> tuple[int, dict]:
    """POST `body` as JSON to a served model's /invocations: the status and the JSON reply (errors too)."""
    request = urllib.request.Request(
        f"{url}/invocations", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


@contextmanager
def serving(model_uri: str, cwd: Path) -> Iterator[str]:
    """The documented serve command for `model_uri`, run from `cwd` in a shell whose environment lacks
    TF_USE_LEGACY_KERAS, MLFLOW_TRACKING_URI and PYTHONPATH (the logged model needs none of them, and the command
    sets none); the served model's base URL once it answers /ping."""
    port = free_port()
    command = documented_serve_command(model_uri, port)
    assert "TF_USE_LEGACY_KERAS" not in command
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("TF_USE_LEGACY_KERAS", "MLFLOW_TRACKING_URI", "PYTHONPATH")
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the venv's mlflow
    log = cwd / "serve.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(
            lambda: answers(f"{url}/ping"),
            240,
            f"{command} to answer /ping",
            every=0.5,
            unless=exited(process, command),
            detail=lambda: log.read_text()[-3000:],
        )
        yield url
    finally:
        stop_group(process)

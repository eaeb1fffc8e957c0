"""A logged model served by README's `mlflow models serve` command, and asked for predictions over HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from helpers.config import REPO


def readme_serve_command(model_uri: str, port: int) -> str:
    """README's serve command for runs:/..., exactly as written there, with the run id and port filled in."""
    readme = (REPO / "README.md").read_text()
    [line] = [line for line in readme.splitlines() if "mlflow models serve -m runs:/<run id>/model" in line]
    assert "--port 5001" in line
    return line.replace("runs:/<run id>/model", model_uri).replace("--port 5001", f"--port {port}")


def post_invocations(url: str, body: dict) -> tuple[int, dict]:
    """POST `body` as JSON to a served model's /invocations: the status and the JSON reply (errors too)."""
    request = urllib.request.Request(f"{url}/invocations", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)

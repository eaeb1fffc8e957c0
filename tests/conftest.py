"""Shared fixtures: real Hydra composition of the project's conf/, tiny runs, a real MLflow store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.entry import prepare_for_tensorflow

prepare_for_tensorflow()  # the tests train in this process: tf_keras, before anything imports TensorFlow

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"

# Small, learnable, fast: a few dozen steps per epoch on synthetic data.
TINY = [
    "dataset=synthetic",
    "dataset.train_examples=512",
    "dataset.test_examples=256",
    "epochs=1",
    "progress=false",
    # Logging the trained model takes seconds per run; the tests that check it ask for it with WITH_MODEL.
    "mlflow.log_model=false",
]
WITH_MODEL = "mlflow.log_model=true"  # after TINY: the last value of a key wins


def compose(overrides: list[str]):
    """The composed config exactly as `python -m runner <overrides>` would see it."""
    from runner.config.check import compose_config

    from runner.sweeps.launchers import rename_launcher_schemas

    rename_launcher_schemas()  # as runner/__main__.py does before composing
    return compose_config(overrides)


def mlflow_settings(tracking_uri: str, *overrides: str):
    """The MLflow settings of `python -m runner mlflow.tracking_uri=<uri> mlflow.experiment_name=tests
    <overrides>` (each `mlflow.<key>=<value>`): the schema's defaults for the rest."""
    from omegaconf import OmegaConf

    from runner.settings import mlflow_settings as settings

    config = compose([f"mlflow.tracking_uri={tracking_uri}", "mlflow.experiment_name=tests", *overrides])
    return settings(OmegaConf.to_container(config, resolve=True))


def dataset_settings(kind: str = "synthetic", **keys):
    """The dataset settings of `python -m runner dataset=<kind> dataset.<key>=<value> ...` (None: null)."""
    from omegaconf import OmegaConf

    from runner.settings import from_config

    overrides = [f"dataset={kind}", *(f"dataset.{key}={'null' if value is None else value}"
                                      for key, value in keys.items())]
    return from_config(OmegaConf.to_container(compose(overrides), resolve=True)).dataset


@pytest.fixture
def tracking_uri(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def train(tmp_path, tracking_uri):
    """Train in this process with the given overrides (single-process strategies on one device)."""
    from omegaconf import OmegaConf

    from runner.settings import from_config
    from runner.train import run

    def _train(*overrides: str, run_dir: Path | None = None):
        args = [*TINY, f"mlflow.tracking_uri={tracking_uri}", *overrides]
        config = OmegaConf.to_container(compose(args), resolve=True)
        return run(from_config(config), config, str(run_dir or tmp_path / "run"), args)

    return _train


def _cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    return {**env, "PYTHONUNBUFFERED": "1", **(extra or {})}


def run_cli(*args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess:
    """`python -m runner <args>` in a fresh process, as a user runs it (`env`: variables to add)."""
    return subprocess.run([sys.executable, "-m", "runner", *args], cwd=cwd, env=_cli_env(env), capture_output=True,
                          text=True, timeout=timeout)


def start_cli(*args: str, cwd: Path) -> subprocess.Popen:
    """`python -m runner <args>` started in the background (for tests that signal or kill it)."""
    return subprocess.Popen([sys.executable, "-m", "runner", *args], cwd=cwd, env=_cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def mlflow_client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def metric_history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))

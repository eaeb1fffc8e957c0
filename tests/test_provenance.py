"""Every run records which code produced it and what it ran on: MLflow's source tags, the runner
checkout's commit and whether it had uncommitted changes, and the versions and CPU reproducibility
depends on. The run is `python -m runner` in a fresh process, started from outside the checkout."""

from __future__ import annotations

import getpass
import importlib.metadata
import platform
import subprocess

import pytest

from helpers.cli import run_cli
from helpers.config import REPO
from helpers.presets import TINY
from helpers.tracking import mlflow_client

pytestmark = pytest.mark.slow


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def test_a_run_is_tagged_with_its_source_commit_versions_and_cpu(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # Sampled before the run: the tree cannot change while the test runs it.
    dirty = "true" if _git("status", "--porcelain", "--untracked-files=no") else "false"
    done = run_cli(
        *TINY, "strategy=one_device", f"mlflow.tracking_uri={uri}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path
    )  # tmp_path is no git checkout: the commit must come from the runner's own
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = (tmp_path / "run" / "mlflow_run_id.txt").read_text().strip()
    tags = mlflow_client(uri).get_run(run_id).data.tags

    assert tags["mlflow.source.git.commit"] == _git("rev-parse", "HEAD")
    assert tags["git_dirty"] == dirty
    assert tags["mlflow.source.type"] == "LOCAL"
    assert tags["mlflow.source.name"] == str(REPO / "runner" / "__main__.py")
    assert tags["mlflow.user"] == getpass.getuser()
    assert tags["versions.tensorflow"] == importlib.metadata.version("tensorflow")
    assert tags["versions.tf_keras"] == importlib.metadata.version("tf-keras")
    assert tags["versions.numpy"] == importlib.metadata.version("numpy")
    assert tags["versions.python"] == platform.python_version()
    assert tags["hardware.gpu"] == "none"  # this machine has no GPU
    with open("/proc/cpuinfo") as handle:
        cpuinfo = handle.read()
    assert tags["hardware.cpu"] in cpuinfo
    flags = set(next(line for line in cpuinfo.splitlines() if line.startswith("flags")).split(":", 1)[1].split())
    listed = tags["hardware.cpu_flags"].split(",")
    assert listed and set(listed) <= flags
    assert ("avx2" in listed) == ("avx2" in flags)

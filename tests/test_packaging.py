"""The package as others meet it: built into a wheel and installed in a fresh environment, it trains from any
directory; importing it, or having it installed beside another Hydra app, changes nothing in their process (what
training needs is set by the runner's own entry points, runner.entry)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from helpers.presets import SWEEP_JOB

REPO = Path(__file__).resolve().parents[1]

# What runner.entry sets, and what other parts of the runner set in their own processes.
RUNNER_VARIABLES = (
    "TF_USE_LEGACY_KERAS",
    "TF_CPP_MIN_LOG_LEVEL",
    "MLFLOW_LOGGING_LEVEL",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT",
    "RAY_AUTH_MODE",
)


def _clean_env() -> dict[str, str]:
    """This environment without what the test session's own entry point (conftest.py) set."""
    return {key: value for key, value in os.environ.items() if key not in RUNNER_VARIABLES}


def _python(code: str, cwd, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_importing_the_package_and_its_settings_changes_nothing(tmp_path):
    code = textwrap.dedent("""
        import json, os, sys
        before = dict(os.environ)
        import runner, runner.config.settings, runner.__main__, hydra_plugins.runner_submitit_launchers
        changed = sorted(key for key in set(before) | set(os.environ) if before.get(key) != os.environ.get(key))
        print(json.dumps({"changed": changed, "tensorflow": "tensorflow" in sys.modules}))
    """)
    result = json.loads(_python(code, tmp_path).stdout.strip().splitlines()[-1])
    assert result == {"changed": [], "tensorflow": False}


@pytest.mark.slow
def test_importing_every_module_leaves_tensorflow_on_its_own_keras(tmp_path):
    """Even a program that imports every module of the package (and so TensorFlow and MLflow, which set
    variables of their own) keeps TensorFlow's default Keras and its own log level."""
    code = textwrap.dedent("""
        import importlib, json, os, pkgutil
        import runner
        for module in pkgutil.walk_packages(runner.__path__, "runner."):
            importlib.import_module(module.name)
        import tensorflow as tf
        print(json.dumps({"variables": {key: os.environ.get(key) for key in sys.argv[1:]},
                          "keras": tf.keras.__name__}))
    """).replace("import importlib,", "import sys, importlib,")
    result = json.loads(_python(code, tmp_path, *RUNNER_VARIABLES).stdout.strip().splitlines()[-1])
    assert result["variables"] == {key: None for key in RUNNER_VARIABLES}
    assert not result["keras"].startswith("tf_keras"), result  # Keras 3, TensorFlow's default


FOREIGN_APP = """
import json, os, sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def app(cfg) -> None:
    launchers = [f"{cls.__module__}.{cls.__name__}" for cls in Plugins.instance().discover(Launcher)]
    print(json.dumps({
        "TF_USE_LEGACY_KERAS": os.environ.get("TF_USE_LEGACY_KERAS"),
        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL"),
        "runner": "runner" in sys.modules,
        "tensorflow": "tensorflow" in sys.modules,
        "plugin_module": "hydra_plugins.runner_submitit_launchers" in sys.modules,
        "launchers": launchers,
        "launcher_target": HydraConfig.get().launcher._target_,
    }))


if __name__ == "__main__":
    app()
"""


def test_an_unrelated_hydra_app_in_the_same_environment_is_untouched(tmp_path):
    """Hydra imports every module under hydra_plugins/, the runner's among them, in every Hydra app of the
    environment (this one has every extra installed): the app's environment and modules stay its own, and its
    `hydra/launcher=submitit_local` is hydra-submitit-launcher's own, as if the runner were not installed."""
    script = tmp_path / "foreign_app.py"
    script.write_text(FOREIGN_APP)
    done = subprocess.run(
        [sys.executable, str(script), "hydra/launcher=submitit_local", "hydra.run.dir=out"],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "schema" not in done.stderr, done.stderr  # no deprecation warning about schema matching either
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # The runner's plugin module was imported and its launchers found, so the check below means something.
    assert seen["plugin_module"] and "hydra_plugins.runner_submitit_launchers.SlurmLauncher" in seen["launchers"]
    assert {key: seen[key] for key in ("TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL", "runner", "tensorflow")} == {
        "TF_USE_LEGACY_KERAS": None,
        "TF_CPP_MIN_LOG_LEVEL": None,
        "runner": False,
        "tensorflow": False,
    }
    assert seen["launcher_target"] == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"


# What the wheel is built from: the files a checkout has under version control that setuptools reads.
SOURCES = ("pyproject.toml", "README.md", "runner", "conf", "hydra_plugins")


def _expected_wheel_files() -> set[str]:
    """Every module of the checkout's packages and every config file, as the wheel should hold them."""
    modules = {
        path.relative_to(REPO).as_posix()
        for top in ("runner", "hydra_plugins")
        for path in (REPO / top).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    configs = {"runner/conf/" + path.relative_to(REPO / "conf").as_posix() for path in (REPO / "conf").rglob("*.yaml")}
    return modules | configs


def _run(command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"{time.monotonic() - started:6.1f} s  {' '.join(map(str, command[:4]))} ...")
    assert done.returncode == 0, (command, done.stdout[-3000:], done.stderr[-3000:])
    return done


@pytest.mark.slow
@pytest.mark.timeout(1500)  # a cold pip cache downloads TensorFlow and MLflow
def test_the_wheel_installed_in_a_fresh_venv_trains_and_sweeps_from_another_directory(tmp_path):
    """What a user does: build the wheel with the standard front end, install it (not editable, with its
    dependencies, at the versions CI tested) in a new venv, and run the `runner` script from a directory that
    is not a checkout: it composes the config the wheel ships, trains, and sweeps two jobs."""
    source = tmp_path / "source"  # a copy, so that the build leaves nothing in the checkout
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    env = {key: value for key, value in _clean_env().items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(source)],
        tmp_path,
        env,
        timeout=600,
    )
    [wheel] = (tmp_path / "dist").glob("hydra_tf_runner-*.whl")
    missing = _expected_wheel_files() - set(zipfile.ZipFile(wheel).namelist())
    assert not missing, f"the wheel lacks {sorted(missing)}: list the package in pyproject.toml"

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env, timeout=300)
    constraints = ["-c", str(REPO / "constraints.txt")] if (REPO / "constraints.txt").is_file() else []
    # --no-compile: the runs compile what they import as they import it; compiling every module of TensorFlow and
    # MLflow ahead tests nothing of the wheel.
    install = [str(venv / "bin" / "pip"), "install", "--quiet", "--no-compile", *constraints, str(wheel)]
    _run(install, tmp_path, env, timeout=1200)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run([str(venv / "bin" / "python"), "-c", "import runner; print(runner.__file__)"], elsewhere, env, 120)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the wheel's, not the checkout's
    job = _run(
        [str(venv / "bin" / "python"), "-m", "runner", "strategy=one_device", "--cfg", "job"], elsewhere, env, 120
    )
    assert "name: one_device" in job.stdout and "fashion_mnist" in job.stdout, job.stdout

    store = f"mlflow.tracking_uri=sqlite:///{elsewhere / 'mlflow.db'}"
    trained = _run([str(venv / "bin" / "runner"), *SWEEP_JOB, store, "hydra.run.dir=run"], elsewhere, env, 300)
    assert "done: test_accuracy" in trained.stdout + trained.stderr, trained.stderr[-3000:]
    assert (elsewhere / "run" / "mlflow_run_id.txt").is_file()
    swept = _run(
        [str(venv / "bin" / "runner"), "-m", "batch=16,32", *SWEEP_JOB, store, "hydra.sweep.dir=sweep"],
        elsewhere,
        env,
        600,
    )
    assert "2 jobs, 2 finished, 0 failed" in swept.stdout, swept.stdout[-3000:] + swept.stderr[-3000:]

"""The package as others meet it: importing it, or having it installed beside another Hydra app, changes nothing
in their process; what training needs is set by the runner's own entry points (runner.entry)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

# What runner.entry sets, and what other parts of the runner set in their own processes.
RUNNER_VARIABLES = ("TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL", "MLFLOW_LOGGING_LEVEL", "RAY_AUTH_MODE")


def _clean_env() -> dict[str, str]:
    """This environment without what the test session's own entry point (conftest.py) set."""
    return {key: value for key, value in os.environ.items() if key not in RUNNER_VARIABLES}


def _python(code: str, cwd, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=_clean_env(), capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_importing_the_package_and_its_settings_changes_nothing(tmp_path):
    code = textwrap.dedent("""
        import json, os, sys
        before = dict(os.environ)
        import runner, runner.settings, runner.__main__, hydra_plugins.runner_submitit_launchers
        changed = sorted(key for key in set(before) | set(os.environ) if before.get(key) != os.environ.get(key))
        print(json.dumps({"changed": changed, "tensorflow": "tensorflow" in sys.modules}))
    """)
    result = json.loads(_python(code, tmp_path).stdout.strip().splitlines()[-1])
    assert result == {"changed": [], "tensorflow": False}


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


FOREIGN_APP = '''
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
'''


def test_an_unrelated_hydra_app_in_the_same_environment_is_untouched(tmp_path):
    """Hydra imports every module under hydra_plugins/, the runner's among them, in every Hydra app of the
    environment (this one has every extra installed): the app's environment and modules stay its own, and its
    `hydra/launcher=submitit_local` is hydra-submitit-launcher's own, as if the runner were not installed."""
    script = tmp_path / "foreign_app.py"
    script.write_text(FOREIGN_APP)
    done = subprocess.run([sys.executable, str(script), "hydra/launcher=submitit_local", "hydra.run.dir=out"],
                          cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "schema" not in done.stderr, done.stderr  # no deprecation warning about schema matching either
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # The runner's plugin module was imported and its launchers found, so the check below means something.
    assert seen["plugin_module"] and "hydra_plugins.runner_submitit_launchers.SlurmLauncher" in seen["launchers"]
    assert {key: seen[key] for key in ("TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL", "runner", "tensorflow")} == {
        "TF_USE_LEGACY_KERAS": None, "TF_CPP_MIN_LOG_LEVEL": None, "runner": False, "tensorflow": False}
    assert seen["launcher_target"] == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"

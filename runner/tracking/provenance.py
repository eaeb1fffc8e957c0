"""What a run records about where it came from, as tags: MLflow's own source tags (`mlflow.user`,
`mlflow.source.name`, `mlflow.source.type`, `mlflow.source.git.*` of the runner package's checkout),
whether that checkout had uncommitted changes, and the versions and CPU that bit-identical reruns
depend on. Computed in the tracker's process: it reads package metadata and /proc, and never imports
TensorFlow (the GPU model comes from the training process, which has TensorFlow loaded)."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform

import runner

log = logging.getLogger("runner")

GIT_DIRTY_TAG = "git_dirty"  # "true" when tracked files of the runner's checkout differ from its commit
VERSION_TAG_PREFIX = "versions."
CPU_TAG = "hardware.cpu"
CPU_FLAGS_TAG = "hardware.cpu_flags"
GPU_TAG = "hardware.gpu"
KERAS_TAG = "keras"  # the Keras package and version the model is built with (runner.builtins.keras_lane)
# Distributions whose versions change the numbers a run computes.
VERSIONED = ("tensorflow", "tf-keras", "numpy")
# The instruction sets TensorFlow's CPU kernels (oneDNN, Eigen) choose their code paths by.
CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def _package_dir() -> str:
    return os.path.dirname(os.path.abspath(runner.__file__))


def source_tags() -> dict[str, str]:
    """MLflow's context tags (user, source name and type, as its fluent start_run resolves them), with the
    git tags taken from the checkout the runner package lives in, wherever the command ran from."""
    from mlflow.utils import mlflow_tags  # noqa: PLC0415  MLflow: train.py imports this module for GPU_TAG

    from runner.compat import mlflow_internals  # noqa: PLC0415  MLflow: that module imports it at its top

    tags = mlflow_internals.context_tags_without_git()
    package = _package_dir()
    commit, branch, repo_url = mlflow_internals.git_source(package)
    if commit is None:  # installed from a wheel, or a checkout without git: no source commit to name
        return tags
    git = {
        mlflow_tags.MLFLOW_GIT_COMMIT: commit,
        mlflow_tags.MLFLOW_GIT_BRANCH: branch,
        mlflow_tags.MLFLOW_GIT_REPO_URL: repo_url,
        GIT_DIRTY_TAG: _dirty(package),
    }
    tags.update({key: value for key, value in git.items() if value is not None})
    return tags


def _dirty(path: str) -> str | None:
    """Uncommitted changes to tracked files (untracked files, such as outputs/ or mlflow.db, do not count)."""
    try:
        from git import Repo  # noqa: PLC0415  GitPython: slow, and its import fails where git is missing (caught)

        return str(Repo(path, search_parent_directories=True).is_dirty(untracked_files=False)).lower()
    except Exception as error:  # no git executable, a damaged repository: leave the tag out, say why
        log.warning("could not tell whether %s has uncommitted changes: %s", path, error)
        return None


def _cpu() -> tuple[str, list[str]]:
    """The CPU's model name and which of CPU_FLAGS it has (from /proc/cpuinfo; elsewhere what platform says)."""
    model: str | None = None
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name") and model is None:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    present = set(line.split(":", 1)[1].split())
                    flags = [flag for flag in CPU_FLAGS if flag in present]
    except OSError:  # not Linux
        pass
    return model or platform.processor() or platform.machine(), flags


def environment_tags() -> dict[str, str]:
    """Versions of Python and of the numerical libraries, and the CPU with its instruction sets."""
    tags = {f"{VERSION_TAG_PREFIX}python": platform.python_version()}
    for name in VERSIONED:
        try:
            tags[VERSION_TAG_PREFIX + name.replace("-", "_")] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            tags[VERSION_TAG_PREFIX + name.replace("-", "_")] = "not installed"
    model, flags = _cpu()
    tags[CPU_TAG] = model
    tags[CPU_FLAGS_TAG] = ",".join(flags) or "none listed"
    return tags


def run_tags() -> dict[str, str]:
    """Every provenance tag of a run."""
    return {**source_tags(), **environment_tags()}

"""Sweep launchers that come from optional extras: which modules each needs and which extra installs them, and
the checks a sweep passes before its parent run exists (the launcher is installed; a Ray cluster's address
answers), so that a sweep that cannot run stops with one paragraph instead of Hydra's or Ray's own failure."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from omegaconf import OmegaConf

from runner.compat.hydra_internals import rename_stored_config
from runner.errors import RunnerError
from runner.sweeps.launch.ray_launcher import check_ray_address, join_with_the_local_ray_token

# The name this project installs under (`import runner` is the package): `pip install 'hydra-tf-runner[ray]'`.
DISTRIBUTION = "hydra-tf-runner"


def _one_at_a_time(launcher: Any) -> int:
    return 1


def _joblib_jobs(launcher: Any) -> int:
    """joblib's n_jobs (-1: every CPU)."""
    jobs = int(launcher.joblib.get("n_jobs") or 1)
    return os.cpu_count() or 1 if jobs < 0 else max(jobs, 1)


def _array_parallelism(launcher: Any) -> int:
    return max(int(launcher.params.get("array_parallelism") or 1), 1)


def _check_ray(config: Any, environ: Mapping[str, str]) -> None:
    check_ray_address(_select(config, "hydra.launcher.ray"), environ)
    join_with_the_local_ray_token()


def _check_slurm(config: Any, environ: Mapping[str, str]) -> None:
    check_time_limit_signal(_select(config, "hydra.launcher"))


def _no_check(config: Any, environ: Mapping[str, str]) -> None:
    pass


@dataclass(frozen=True)
class Launcher:
    """One launcher a sweep can use (`hydra/launcher=<option>`), and every fact the sweep side needs of it. Adding a
    launcher is adding a record to LAUNCHERS and its conf/hydra/launcher/<option>.yaml (docs/architecture.md)."""

    option: str  # hydra/launcher=<option>, and the `launcher` tag of its jobs' child runs
    targets: tuple[str, ...]  # the _target_ of its config (the shipped one first), the class of its instances
    extra: str | None = None  # the optional extra that installs it: pip install 'hydra-tf-runner[<extra>]'
    modules: tuple[str, ...] = ()  # what that extra brings (the Hydra plugin first)
    schema_module: str | None = None  # the plugin module that stores its structured config (rename_launcher_schemas)
    # Its launch() may run in several threads at once (each call its own pool call or submission), so that the
    # Optuna sweeper keeps a trial per free slot; otherwise trials go in batches.
    launches_from_threads: bool = False
    # Its jobs run on the sweep's machine: their training processes watch the sweep's process (runner.lifeline).
    on_the_sweeps_machine: bool = False
    # Its jobs run in long-lived processes (the sweep's own, joblib's workers, Ray's worker processes, which Ray
    # reuses from task to task), whose warm training workers train run after run (runner.sweeps.launch.warm_pool).
    # submitit runs each job as a process of its own that ends with it: nothing to keep warm.
    keeps_warm_workers: bool = False
    # Its jobs run in the sweep's own process, one after another: the sweep starts their first warm worker as it
    # starts, so that the worker imports while the sweep creates its parent run and study.
    jobs_in_the_sweeps_process: bool = False
    parallelism: Callable[[Any], int] = _one_at_a_time  # jobs at once, read off the launcher
    check: Callable[[Any, Mapping[str, str]], None] = _no_check  # before the sweep's parent run exists


_SUBMITIT = ("hydra_plugins.hydra_submitit_launcher", "submitit")
_SUBMITIT_SCHEMA = "hydra_plugins.hydra_submitit_launcher.config"

LAUNCHERS = {
    launcher.option: launcher
    for launcher in (
        Launcher(
            "basic",
            ("hydra._internal.core_plugins.basic_launcher.BasicLauncher",),
            on_the_sweeps_machine=True,
            keeps_warm_workers=True,
            jobs_in_the_sweeps_process=True,
        ),
        Launcher(
            "joblib",
            ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",),
            launches_from_threads=True,
            on_the_sweeps_machine=True,
            keeps_warm_workers=True,
            parallelism=_joblib_jobs,
        ),
        Launcher(
            "ray",
            ("hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher",),
            extra="ray",
            modules=("hydra_plugins.hydra_ray_launcher", "ray"),
            schema_module="hydra_plugins.hydra_ray_launcher._config",
            keeps_warm_workers=True,
            check=_check_ray,
        ),
        Launcher(
            "submitit_slurm",
            (
                "hydra_plugins.runner_submitit_launchers.SlurmLauncher",
                "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
            ),
            extra="slurm",
            modules=_SUBMITIT,
            schema_module=_SUBMITIT_SCHEMA,
            launches_from_threads=True,
            parallelism=_array_parallelism,
            check=_check_slurm,
        ),
        Launcher(
            "submitit_local",
            (
                "hydra_plugins.runner_submitit_launchers.LocalLauncher",
                "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
            ),
            extra="slurm",
            modules=_SUBMITIT,
            schema_module=_SUBMITIT_SCHEMA,
            launches_from_threads=True,
            on_the_sweeps_machine=True,
            parallelism=_array_parallelism,
        ),
    )
}
OPTIONAL_LAUNCHERS = {option: launcher for option, launcher in LAUNCHERS.items() if launcher.extra is not None}


def launcher_of(target: str) -> Launcher | None:
    """The launcher whose config's _target_ (or whose instance's class) is `target`; None for one of a user's own."""
    return next((launcher for launcher in LAUNCHERS.values() if target in launcher.targets), None)


def launcher_name(target: str) -> str:
    """The short name of the launcher whose config's _target_ is `target` (the `launcher` tag): its option, or for
    a launcher of a user's own, its class's name without `Launcher`."""
    known = launcher_of(target)
    if known is not None:
        return known.option
    module, _, name = target.rpartition(".")
    short = name.lower().removesuffix("launcher") or name.lower()
    return f"submitit_{short}" if "submitit" in module else short


def class_path(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


_LAUNCHER_OVERRIDE = re.compile(r"(?:\+{1,2}|~)?hydra/launcher=(?P<option>[^\s]+)")


def requested_options(args: Iterable[str]) -> list[str]:
    """The launcher options a command line names (`hydra/launcher=ray`)."""
    return [match["option"] for match in map(_LAUNCHER_OVERRIDE.fullmatch, args) if match]


def _missing_module(launcher: Launcher) -> str | None:
    for module in launcher.modules:
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except (ImportError, ValueError):  # a parent package is missing, or the module is blocked
            return module
    return None


def require_installed(option: str) -> None:
    """Raise the paragraph naming the extra to install if the launcher `option` needs one that is missing."""
    launcher = OPTIONAL_LAUNCHERS.get(option)
    if launcher is None or launcher.extra is None:
        return
    missing = _missing_module(launcher)
    if missing is not None:
        raise RunnerError(
            f"hydra/launcher={option} needs the optional extra '{launcher.extra}', which is not installed here "
            f"(no module {missing!r}). Fix: pip install '{DISTRIBUTION}[{launcher.extra}]' (from a checkout: "
            f"pip install -e '.[{launcher.extra}]') in this environment and in the one the jobs run in, or sweep "
            "with the default launcher or hydra/launcher=joblib."
        )


def check_launcher(args: Iterable[str]) -> None:
    """Before Hydra composes anything: every optional launcher the command line names is installed, and
    SLURM's commands are there for submitit_slurm."""
    for option in requested_options(args):
        require_installed(option)
        if option == "submitit_slurm":
            require_sbatch()


def require_sbatch() -> None:
    if shutil.which("sbatch") is None:
        raise RunnerError(
            "hydra/launcher=submitit_slurm submits every job with sbatch, which is not on the PATH: this machine "
            "is not a SLURM login node, or SLURM's commands are not on the PATH. Fix: run the sweep where sbatch, "
            "squeue and scontrol work (add SLURM's bin directory to PATH), or run the jobs on this machine with "
            "hydra/launcher=submitit_local or hydra/launcher=joblib."
        )


# The plugins' structured configs that conf/hydra/launcher/<option>.yaml extends (Launcher.schema_module). Stored
# under the option's name, Hydra would match the file to the structured config of the same name, a behaviour
# Hydra 1.1 deprecated; stored as <option>_schema, each file lists its base explicitly.
SCHEMA_SUFFIX = "_schema"


def rename_launcher_schemas() -> None:
    """Move the launcher plugins' structured configs from `hydra/launcher/<option>` to `<option>_schema` in this
    process's ConfigStore, so that `hydra/launcher=<option>` finds conf/hydra/launcher/<option>.yaml, which names
    that schema in its defaults list (Hydra's migration from automatic schema matching: rename one of the two).

    Called by whatever composes the runner's config (runner/__main__.py, tests/helpers/config.py), never on import:
    other Hydra apps in the environment keep the plugins' configs as they are. Launchers carry the ConfigStore
    to their jobs (Hydra's Singleton state), so a job composes the same way. A plugin that is not installed
    is skipped (check_launcher says what to install); calling this again changes nothing."""
    # Hydra's plugin scan, once per process, runs every module under hydra_plugins/ again (even one already
    # imported), and so stores the plugins' configs anew: scan first, then rename.
    Plugins.instance()
    store = ConfigStore.instance()
    for launcher in LAUNCHERS.values():
        if launcher.schema_module is None:
            continue
        try:
            importlib.import_module(launcher.schema_module)  # stores the plugin's configs (a no-op once imported)
        except ImportError:
            continue
        rename_stored_config(store, "hydra/launcher", launcher.option, launcher.option + SCHEMA_SUFFIX)


def check_before_sweep(config: Any, trial_models: str = "every", environ: Mapping[str, str] = os.environ) -> None:
    """Before a sweep's parent run exists: its launcher is installed and, for Ray, the cluster answers (and the
    sweep will join it with this machine's Ray token, if it has one); `trial_models` (sweep.trial_models) of
    `champion` needs the jobs on the sweep's machine, where the champion's checkpoint is
    (runner.sweeps.job.champion)."""
    target = str(_select(config, "hydra.launcher._target_") or "")
    launcher = launcher_of(target)
    if launcher is not None:
        require_installed(launcher.option)
        launcher.check(config, environ)
    if trial_models == "champion" and (launcher is None or not launcher.on_the_sweeps_machine):
        raise RunnerError(
            "sweep.trial_models=champion exports the sweep's champion from its checkpoint on the sweep's machine "
            f"once the sweep has chosen, but hydra/launcher={launcher_name(target)} runs the jobs elsewhere, where "
            "their checkpoints are. Fix: drop sweep.trial_models=champion (every run then logs its model as it "
            "finishes), or sweep with the basic launcher, hydra/launcher=joblib or hydra/launcher=submitit_local."
        )


def check_time_limit_signal(launcher_config: Any) -> None:
    """submitit asks SLURM for its time-out signal signal_delay_s before each job's time limit: that must fall
    inside the job's time, or SLURM signals the time-out as soon as the job starts and every job ends FAILED
    without training."""
    timeout_min, delay = launcher_config.timeout_min, launcher_config.signal_delay_s
    if isinstance(timeout_min, int) and isinstance(delay, int) and delay >= timeout_min * 60:
        raise RunnerError(
            f"hydra.launcher.signal_delay_s={delay} is not less than the jobs' time limit, "
            f"hydra.launcher.timeout_min={timeout_min} ({timeout_min * 60} s): SLURM would send submitit's time-out "
            "signal as soon as each job starts, and every job would end FAILED without training. Fix: lower "
            f"hydra.launcher.signal_delay_s below {timeout_min * 60} (it is how long a job has to save its "
            "checkpoint before the limit, e.g. hydra.launcher.signal_delay_s=30), or raise hydra.launcher.timeout_min."
        )


def _select(config: Any, key: str) -> Any:
    return OmegaConf.select(config, key)

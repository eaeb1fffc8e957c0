"""Which process of a job holds its run directory (runner.run_lock), taken in a Hydra callback's on_run_start,
before Hydra writes anything into the directory (`.hydra/`, the log file), so a refused run touches nothing there.

Who holds it when several processes share a run directory by design:
- a single process (cluster=none) holds its own;
- cluster=local: the launcher holds it for the whole job; its tasks (its children) run under its hold;
- cluster=tf_config and cluster=slurm: the chief task holds it (TF_CONFIG's chief, or worker 0 without
  one; SLURM task 0); the other workers and the parameter servers take no lock;
- a sweep: each job's training process holds its job directory (runner.sweeps.job.job starts it); a job that finds
  it held waits for the holder (runner.run_lock.wait_while_held).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runner.clusters.roles import is_chief
from runner.errors import RunnerError, report
from runner.run_lock import hold


class RunDirectoryLock(Callback):
    """Holds the run directory for this process (see the module's docstring), or exits with status 2."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not _holds_for_job(config.get("cluster")):
            return
        try:
            hold(os.path.abspath(str(config.hydra.run.dir)))
        except RunnerError as error:
            # A callback's exceptions only become warnings in Hydra; SystemExit is what stops the command.
            report("error", error)
            sys.exit(2)


def _holds_for_job(cluster: Any) -> bool:
    """Whether this process holds the run directory for its job (cluster.kind and the task's role)."""
    kind = cluster.get("kind", "none") if hasattr(cluster, "get") else "none"
    if kind == "tf_config":
        try:
            config = json.loads(os.environ.get("TF_CONFIG") or "{}")
            task, spec = config["task"], config["cluster"]
            return is_chief(dict(spec), task["type"], int(task.get("index", 0)))
        except (ValueError, TypeError, KeyError, AttributeError):
            return True  # a TF_CONFIG that does not parse: the run stops at its check anyway
    if kind == "slurm":
        return os.environ.get("SLURM_PROCID", "0") == "0"
    return True

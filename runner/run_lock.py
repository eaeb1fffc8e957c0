"""One job per run directory: a second `python -m runner` with the same hydra.run.dir is refused at once.

Two processes in one run directory would write the same checkpoint files and log every epoch twice into
the same MLflow run. The holder keeps an exclusive flock(2) on `<run dir>/.runner.lock` (which names its
pid) for as long as it lives; the kernel drops it when the process ends, `kill -9` included, so a re-run
after a crash resumes as usual. The lock is taken in a Hydra callback's on_run_start, before Hydra writes
anything into the directory (`.hydra/`, the log file), so a refused run touches nothing there.

Who holds it when several processes share a run directory by design:
- a single process (cluster=none) holds its own;
- cluster=local: the launcher holds it for the whole job; its tasks (its children) run under its hold;
- cluster=tf_config and cluster=slurm: the chief task holds it (TF_CONFIG's chief, or worker 0 without
  one; SLURM task 0); the other workers and the parameter servers take no lock;
- a sweep: each job's training process holds its job directory (runner.sweeps.job starts it), so the
  same sweep run twice at once has its duplicate jobs refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runner.clusters.roles import is_chief
from runner.errors import RunnerError, report

LOCK_FILE = ".runner.lock"

_held: list[int] = []  # descriptors of the locks this process holds, open until it exits


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


def hold(run_dir: str) -> None:
    """Lock run_dir for this process; refuse if another process holds it (unless it is this one's
    parent: the cluster=local launcher, holding it for its tasks)."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, LOCK_FILE)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _pid_in(descriptor)
        os.close(descriptor)
        if holder is not None and holder == os.getppid():
            return
        raise RunnerError(
            f"hydra.run.dir={run_dir} is in use by another runner process ({_describe(holder)}, which holds "
            f"{path}): two processes in one run directory would write the same checkpoints and log each epoch "
            "twice into the same MLflow run. Fix: wait for that run to end (or stop it"
            f"{f': kill {holder}' if holder else ''}) and re-run this command to resume it, or leave "
            "hydra.run.dir unset (or pick another directory) to start a separate run."
        ) from None
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"{os.getpid()}\n".encode())
    _held.append(descriptor)


def _pid_in(descriptor: int) -> int | None:
    try:
        return int(os.pread(descriptor, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None


def _describe(pid: int | None) -> str:
    """'pid 123: python -m runner ...' from /proc when it can be read."""
    if pid is None:
        return "its pid is not written yet"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return f"pid {pid}"
    return f"pid {pid}: {command[:200]}" if command else f"pid {pid}"


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

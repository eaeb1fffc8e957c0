"""hydra/launcher=submitit_slurm and submitit_local: hydra-submitit-launcher's launchers, waiting for
their jobs in a way that does not need SLURM's accounting.

submitit learns a job's state from `sacct`; on a cluster without accounting, a job that SLURM killed
(time limit, scancel, node failure) before it wrote its result keeps submitit waiting forever, and
one job that raised would abort the whole sweep. Here the sweep's process waits on each job's result
file and, under SLURM, on `scontrol show job`: a job that ended without a result is recorded as a
FAILED child run (runner.sweeps.job.job.record_lost_job) with a worst-possible objective, and the sweep goes
on to its summary. The jobs themselves run as hydra-submitit-launcher runs them (its `__call__`).

Importing this module needs the `slurm` extra: runner/__main__.py says so first when it is missing. Hydra
finds the launcher classes in hydra_plugins/runner_submitit_launchers.py, whose `launch` calls launch() here.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from omegaconf import OmegaConf, open_dict

from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from runner import outcome
from runner.compat.hydra_internals import submitit_executor
from runner.errors import RunnerError
from runner.outcome import OUTCOME_FILE

log = logging.getLogger("runner")

# SLURM's states of a job that will not run any more (scontrol show job's JobState).
_ENDED = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
    "SPECIAL_EXIT",
    "REVOKED",
}
# Held while a submission captures sys.stderr (_Sweep.launch).
_SUBMITTING = threading.Lock()
# How long a job's result file may lag behind its end (a shared filesystem's caches).
RESULT_GRACE_SECONDS = 15.0
_POLL_SECONDS = 1.0
_SLURM_POLL_SECONDS = 5.0


def launch(launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
    """`launcher.launch`: submit the jobs with the executor the launcher names (slurm, local) and wait on
    them as the module says. `launcher` is a hydra-submitit-launcher BaseSubmititLauncher, set up by Hydra."""
    return _Sweep(launcher).launch(job_overrides, initial_job_idx)


class _Sweep:
    """One sweep's jobs under hydra-submitit-launcher's launcher: submitted, then waited on."""

    def __init__(self, launcher):
        self.launcher = launcher
        self.executor = submitit_executor(launcher)  # slurm | local
        self.params = launcher.params
        self.config = launcher.config
        self.hydra_context = launcher.hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit  # noqa: PLC0415  an optional extra: hydra-tf-runner[slurm]

        assert self.config is not None
        params = dict(self.params)
        init_keys = {"submitit_folder", "max_num_timeout"}
        executor = submitit.AutoExecutor(
            folder=params["submitit_folder"],
            cluster=self.executor,
            **({f"{self.executor}_max_num_timeout": params["max_num_timeout"]} if "max_num_timeout" in params else {}),
        )
        generic = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(
            **{
                key if key in generic else f"{self.executor}_{key}": value
                for key, value in params.items()
                if key not in init_keys
            }
        )
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(
            "submitit '%s' sweep output dir: %s; jobs' logs in %s",
            self.executor,
            sweep_dir,
            params["submitit_folder"].replace("%j", "<job id>"),
        )
        numbered = [(initial_job_idx + index, list(overrides)) for index, overrides in enumerate(job_overrides)]
        for number, overrides in numbered:
            log.info("\t#%d : %s", number, " ".join(filter_overrides(overrides)))
        arguments = [
            (overrides, "hydra.sweep.dir", number, f"job_id_for_{number}", Singleton.get_state())
            for number, overrides in numbered
        ]
        # The launcher itself is what runs on the node (hydra-submitit-launcher's __call__).
        # submitit prints a refusing sbatch's stderr before raising it: the paragraph below says it once. sys.stderr
        # is the process's, and the Optuna sweeper's slots submit from several threads: one at a time swaps it.
        said = io.StringIO()
        try:
            with _SUBMITTING, contextlib.redirect_stderr(said):
                jobs = executor.map_array(self.launcher, *zip(*arguments, strict=True))
        except submitit.core.utils.FailedJobError as error:  # sbatch refused: no job exists to wait on
            refused = self._not_submitted(str(error), len(numbered))
            from runner.sweeps.plugins.parent_run import fail_parent_run  # noqa: PLC0415  MLflow: only when the sweep stops

            fail_parent_run(self.config, str(refused))
            raise refused from None
        sys.stderr.write(said.getvalue())
        return [self._settle(job, number, overrides) for job, (number, overrides) in zip(jobs, numbered, strict=True)]

    def _not_submitted(self, said: str, count: int) -> RunnerError:
        """The paragraph for a submission that sbatch (or submitit's local executor) refused: what it said, and
        what makes it work (a SLURM controller that answers, or a launcher that needs none)."""
        lines = [" ".join(line.split()) for line in said.splitlines() if line.strip()]
        line = next((text for text in lines if "error" in text.lower()), lines[0] if lines else "no message")[:400]
        sweep_dir = os.path.abspath(str(self.config.hydra.sweep.dir))
        if self.executor != "slurm":
            return RunnerError(
                f"hydra/launcher=submitit_local could not start the sweep's {count} job(s): submitit said "
                f"{line!r}. Fix: see that message, or sweep with the default launcher or hydra/launcher=joblib; "
                f"then re-run the same command with hydra.sweep.dir={sweep_dir}."
            )
        conf = os.environ.get("SLURM_CONF", "SLURM's default /etc/slurm/slurm.conf")
        return RunnerError(
            f"hydra/launcher=submitit_slurm could not submit the sweep's {count} job(s): sbatch said {line!r} "
            f"(its configuration: {conf}). No job was submitted, and the sweep's MLflow parent run ends FAILED. "
            "Fix: make sure a SLURM controller answers here (`scontrol ping` says UP; start slurmctld, or point "
            "SLURM_CONF at the cluster's slurm.conf), or run the jobs on this machine with "
            "hydra/launcher=submitit_local or the default launcher (drop the hydra/launcher override); then re-run "
            f"the same command with hydra.sweep.dir={sweep_dir}."
        )

    def _settle(self, job, number: int, overrides: list[str]) -> JobReturn:
        """Wait for the job; its JobReturn, or, if it ended without one, a worst-value JobReturn for a job
        recorded as FAILED."""
        ended_at = None
        next_check = 0.0
        while True:
            if _has_results(job):
                try:
                    result = job.results()[0]
                    # What the job raised inside Hydra's run_job (submitit's time-out) is raised again here.
                    _ = result.return_value  # the property raises what the job raised
                except Exception as error:  # the job raised, or a task died: the sweep goes on without it
                    return self._lost(job, number, overrides, self._how_it_ended(error))
                return result
            now = time.monotonic()
            if ended_at is None and now >= next_check:
                next_check = now + _SLURM_POLL_SECONDS
                state = self._ended_state(job)
                if state is not None:
                    ended_at, ended_state = now, state
            if ended_at is not None and now - ended_at > RESULT_GRACE_SECONDS:
                how = (
                    f"{self._time_limit()} without a result"
                    if ended_state == "TIMEOUT"
                    else f"it ended {ended_state} without a result (killed by scancel, a node failure or running out "
                    "of memory)"
                )
                return self._lost(job, number, overrides, how)
            time.sleep(_POLL_SECONDS)

    def _ended_state(self, job) -> str | None:
        """The job's final state if it has ended, else None."""
        state = job.state if self.executor == "local" else _slurm_state(job)
        return (
            state
            if state is not None
            and state.upper()
            not in (
                "READY",
                "PENDING",
                "RUNNING",
                "UNKNOWN",
                "REQUEUED",
                "COMPLETING",
                "CONFIGURING",
                "RESIZING",
                "SUSPENDED",
            )
            else None
        )

    def _how_it_ended(self, error: BaseException) -> str:
        text = str(error).strip()
        first_line = (text.splitlines()[0] if text else type(error).__name__)[:300]
        if "timed-out" in first_line:  # submitit's UncompletedJobError at the time-out signal
            return f"{self._time_limit()} (submitit: {first_line})"
        return f"it ended with an error: {first_line}"

    def _time_limit(self) -> str:
        return f"it reached its time limit, hydra.launcher.timeout_min={self.params.get('timeout_min')}"

    def _lost(self, job, number: int, overrides: list[str], how: str) -> JobReturn:
        from runner.sweeps.job.job import record_lost_job  # noqa: PLC0415  MLflow: only for a job submitit lost

        assert self.hydra_context is not None and self.config is not None
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config.hydra.job):
            config.hydra.job.num = number
            config.hydra.job.id = str(job.job_id)
        job_dir = os.path.join(str(config.hydra.sweep.dir), str(config.hydra.sweep.subdir))
        logs = Path(str(job.paths.stderr))
        error = (
            f"{'SLURM' if self.executor == 'slurm' else 'submitit'} job {job.job_id} of job {number} stopped "
            f"before the job finished: {how}{_training_said(job_dir)}; its log: {logs}. Fix: see that log; raise "
            "hydra.launcher.timeout_min or hydra.launcher.mem_gb if it ran out of either, then re-run the same "
            f"command with "
            f"hydra.sweep.dir={os.path.abspath(str(config.hydra.sweep.dir))} to run the jobs that did not finish."
        )
        value = record_lost_job(config, job_dir, error, str(job.job_id) if self.executor == "slurm" else None)
        result = JobReturn(
            overrides=overrides,
            cfg=config,
            hydra_cfg=config,
            working_dir=job_dir,
            task_name=str(config.hydra.job.name),
            status=JobStatus.COMPLETED,
        )
        result.return_value = value
        return result


def _training_said(job_dir: str) -> str:
    """What the job's training process said of its end in its outcome file, if it got to write one."""
    file = os.path.join(job_dir, OUTCOME_FILE)
    if not os.path.exists(file):
        return ""
    ended = outcome.read(file, None, who="its training process")
    return f" (its training process ended {ended.status}" + (f": {ended.message})" if ended.message else ")")


def _has_results(job) -> bool:
    jobs = getattr(job, "_sub_jobs", None) or [job]
    return all(Path(sub.paths.result_pickle).exists() for sub in jobs)


def _slurm_state(job) -> str | None:
    """JobState from `scontrol show job` (ended jobs stay there for SLURM's MinJobAge, 300 s by default);
    a job SLURM no longer knows has ended."""
    try:
        done = subprocess.run(
            ["scontrol", "show", "job", "-o", str(job.job_id)], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return "PURGED" if "Invalid job id" in done.stderr else None
    for item in done.stdout.split():
        if item.startswith("JobState="):
            return item.partition("=")[2]
    return None

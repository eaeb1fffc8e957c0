"""sweep.trial_models=champion: the sweep's champion alone logs its model, once the sweep has chosen it.

A run's model export (the restored model as a SavedModel, MLflow's LoggedModel and its check that the model serves:
about 2.5 s of one core for the tutorial's CNN) is most of a small trial's ending, and a sweep registers one model.
With `champion`, each job tells its runs to skip the export (runner.outcome.MODEL_AT_SWEEP_END_VARIABLE; the run
says so in its log), and when the sweep has chosen, before it registers, the champion's run is continued once in
its run directory with the arguments it trained with (runner.sweeps.job.run_command): it has trained every epoch, so it
restores its kept checkpoint (the best epoch's with checkpoint.keep_best), evaluates it without logging again what it
logged, and logs its model, in one of the sweep's warm workers or a fresh process. The registry then takes it as with
`every`. Only where the jobs ran on the sweep's machine, where the champion's checkpoint is.
"""

from __future__ import annotations

import logging
import os

from mlflow.tracking import MlflowClient

from runner import outcome
from runner.errors import RunnerError
from runner.lifeline import Process, lifeline
from runner.outcome import OUTCOME_FILE, OUTCOME_VARIABLE, SWEEP_DIR_VARIABLE
from runner.sweeps.job.job import RUNNER_COMMAND, train_in_process
from runner.sweeps.job.run_command import RunCommand
from runner.sweeps.launch.warm_pool import POOL, worker_kind
from runner.sweeps.sweep_config import SweepConfig
from runner.sweeps.terms import RUN_DIR_TAG
from runner.tracking.mlflow_tracker import run_model

log = logging.getLogger("runner")


def log_champion_model(client: MlflowClient, sweep: SweepConfig, sweep_dir: str, run_id: str, label: str) -> None:
    """The champion's run `run_id` continued until it has logged its model (nothing to do if it has one: an earlier
    attempt of the sweep logged it); a RunnerError if it could not."""
    if run_model(client, run_id) is not None:
        return
    run_dir = client.get_run(run_id).data.tags[RUN_DIR_TAG]
    command = RunCommand.read(run_dir)
    log.info("sweep.trial_models=champion: logging the model of the champion, %s (MLflow run %s)", label, run_id)
    code = _continue(sweep, command, run_dir, sweep_dir)
    if code != 0 or run_model(client, run_id) is None:
        raise RunnerError(
            f"the sweep's champion, {label} (MLflow run {run_id}), could not log its model (its continuation in "
            f"{run_dir} ended with exit status {code}; its log there says why), so no model is registered. Fix: "
            f"remove the cause, then re-run the same sweep command with hydra.sweep.dir={sweep_dir}: its "
            "finished jobs are skipped and the champion's model is logged and registered."
        )


def _continue(sweep: SweepConfig, command: RunCommand, run_dir: str, sweep_dir: str) -> int:
    """Continue the run in a warm worker of its kind (one of the sweep's, idle now) or a fresh process; its exit status
    once it has ended. Either way the run knows its sweep's directory, as its job's runs do: a continuation that
    stops resumable advises re-running the sweep."""
    outcome_file = os.path.join(run_dir, OUTCOME_FILE)
    watched = lifeline([Process.this()])
    own = {**command.environ, SWEEP_DIR_VARIABLE: os.path.abspath(sweep_dir)}
    kind = worker_kind(sweep)
    if kind is None:
        return train_in_process([*RUNNER_COMMAND, *command.arguments], command.cwd, outcome_file, {**own, **watched})
    outcome.forget(outcome_file)
    environ = {**own, OUTCOME_VARIABLE: outcome_file}
    limit = sweep.sweep.worker_memory_mb
    return POOL.train(kind, command.arguments, command.cwd, environ, watched, limit, to_the_end=True)

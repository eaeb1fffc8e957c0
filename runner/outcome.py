"""How a process of the runner ended, in one JSON file its supervisor reads: status, the paragraph the user saw,
the final metrics. Every process writes it once where it ends; no supervisor reads an outcome from stderr.

A process started by a supervisor (a sweep job's training, a local cluster's task) writes where OUTCOME_VARIABLE
says; any other writes `outcome.json` in its run directory, or `outcome-<type>-<index>.json` as a task of a
cluster whose tasks share that directory (cluster=tf_config, cluster=slurm).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from runner.metric_table import COST_KEYS, DEFAULT_TABLE, MetricTable

# Set by a supervisor for the one process it starts: the path of the file that process writes.
OUTCOME_VARIABLE = "RUNNER_OUTCOME_FILE"
OUTCOME_FILE = "outcome.json"
# Set by a sweep job whose sweep logs its champion's model alone (sweep.trial_models=champion): the run skips its
# model's export, which the sweep does for its champion once it has chosen it (runner.sweeps.job.champion).
MODEL_AT_SWEEP_END_VARIABLE = "RUNNER_MODEL_AT_SWEEP_END"
# Set by a sweep job for each run it trains: the sweep's directory, whose re-run continues a run that stopped.
SWEEP_DIR_VARIABLE = "RUNNER_SWEEP_DIR"
FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"
STATUSES = (FINISHED, FAILED, KILLED)
# A run with early stopping (runner.training.early_stopping): its best epoch by the watched metric, and the epoch it
# stopped after where that came before its last.
BEST_EPOCH_TAG = "best_epoch"
STOPPED_AT_EPOCH_TAG = "stopped_at_epoch"
# With checkpoint.keep_best, where the best epoch came before the last: the step after the last epoch, at which the
# best epoch's metrics are logged again (runner.training.actions.LogBestEpochMetrics); no epoch's curve point.
BEST_METRICS_STEP_TAG = "best_metrics_step"


def resume_advice(run_dir: str, every_task: bool = False, environ: Mapping[str, str] = os.environ) -> str:
    """How a run that stopped resumable is continued: a sweep's run by re-running its sweep (which continues each
    unfinished run in place), any other by running its command again in its run directory (`every_task`: each
    task of its cluster)."""
    sweep_dir = environ.get(SWEEP_DIR_VARIABLE)
    if sweep_dir:
        return f"re-run the sweep's command with hydra.sweep.dir={sweep_dir}, which continues this run"
    if every_task:
        return f"start every task again with the same command and hydra.run.dir={run_dir}"
    return f"re-run the same command with hydra.run.dir={run_dir}"


def model_at_sweep_end(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this run leaves its model's export to its sweep (MODEL_AT_SWEEP_END_VARIABLE)."""
    return environ.get(MODEL_AT_SWEEP_END_VARIABLE) == "1"


@dataclass(frozen=True)
class Outcome:
    """FINISHED (exit code 0, the metrics), FAILED (the paragraph: `error: ...`) or KILLED (`preempted: ...`,
    resumable from its last checkpoint)."""

    status: str
    exit_code: int = 0
    paragraph: str = ""  # the process's last paragraph exactly as the user saw it ("error: ...", "preempted: ...")
    resumable: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    run_id: str | None = None  # the run directory's MLflow run, whenever it has one (FAILED and KILLED too)
    task: str | None = None  # "worker 1" for a task of a cluster

    @property
    def message(self) -> str:
        """The paragraph without its `error: ` or `preempted: ` (an MLflow run's `error` tag)."""
        kind, separator, rest = self.paragraph.partition(": ")
        return rest if separator and kind in ("error", "preempted") else self.paragraph


# Told of this process's outcome as soon as the run's result is known, before its model's export and its MLflow
# run's end (a warm sweep worker, which answers its job then: runner.warm_worker). Empty in any other process.
_early_listeners: list[Callable[[Outcome], None]] = []


def listen_early(listener: Callable[[Outcome], None]) -> None:
    """Have `listener` told of the outcome of each run this process trains as soon as it is known."""
    _early_listeners.append(listener)


def heard_early() -> bool:
    """Whether anyone listens for the outcome before the run has ended (listen_early)."""
    return bool(_early_listeners)


def tell_early(outcome: Outcome) -> None:
    for listener in _early_listeners:
        listener(outcome)


def finished(result: Any, table: MetricTable = DEFAULT_TABLE, task: str | None = None) -> Outcome:
    """The outcome of a training that finished: a runner.train.RunResult's final numbers, each of `table`'s result
    keys that it holds. They come from the run's last logged value of each metric, so a resumed run that had no epoch
    left to train still reports the numbers of its last epoch."""
    metrics = {
        key: float(result.final_metrics[key])
        for key in table.result_keys
        if key not in table.eval_keys and (key in result.final_metrics or not _may_lack(key))
    }
    metrics.update((key, float(result.eval_scores.get(key, float("nan")))) for key in table.eval_keys)
    return Outcome(FINISHED, metrics=metrics, run_id=result.run_id, task=task)


def _may_lack(key: str) -> bool:
    """Whether a finished run may lack `key`: val_* without a validation split, the costs of a run stopped early by
    its pruner (never restored) or of one whose model is logged after its outcome (model_bytes)."""
    return key.startswith("val_") or key in COST_KEYS


def path(run_dir: str, task_type: str | None = None, index: int = 0, environ: Mapping[str, str] = os.environ) -> str:
    """Where this process writes its outcome: what its supervisor asked for, else in its run directory."""
    if environ.get(OUTCOME_VARIABLE):
        return str(environ[OUTCOME_VARIABLE])
    name = OUTCOME_FILE if task_type is None else f"outcome-{task_type}-{index}.json"
    return os.path.join(run_dir, name)


def write(file: str, outcome: Outcome) -> None:
    """Write `outcome` to `file` at once: a reader sees the whole file or none."""
    if outcome.status not in STATUSES:
        raise ValueError(f"status {outcome.status!r} is not one of {', '.join(STATUSES)}")
    os.makedirs(os.path.dirname(os.path.abspath(file)), exist_ok=True)
    temporary = f"{file}.{os.getpid()}.tmp"
    with open(temporary, "w") as handle:
        json.dump(asdict(outcome), handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, file)


def forget(file: str) -> None:
    """Remove an earlier process's outcome before starting the next one that writes `file`."""
    try:
        os.remove(file)
    except FileNotFoundError:
        pass


def read(file: str, exit_code: int | None, who: str = "the process") -> Outcome:
    """The outcome the process that ended with `exit_code` (None: not known here) wrote to `file`; if it wrote
    none (it was killed outright, or died before it could), a FAILED outcome whose paragraph says so."""
    try:
        with open(file) as handle:
            data = json.load(handle)
        outcome = Outcome(**data)
        if outcome.status not in STATUSES or not isinstance(outcome.paragraph, str):
            raise ValueError(outcome.status)
        return outcome
    except (OSError, ValueError, TypeError):
        code = 1 if exit_code is None else exit_code
        return Outcome(FAILED, code, f"error: {no_outcome(who, exit_code, file)}")


def no_outcome(who: str, exit_code: int | None, file: str) -> str:
    """The paragraph for a process that ended without writing its outcome."""
    if exit_code is None:
        how = "ended"
    elif exit_code < 0:
        try:
            how = f"was killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            how = f"was killed by signal {-exit_code}"
    else:
        how = f"ended with status {exit_code}"
    return f"{who} {how} and wrote no outcome ({file}): it was killed, or died before it could say why."


def default_objective(score: str = "accuracy") -> str:
    """The objective when sweep.objective is null: the task's score (task.objective) on the validation split a
    sweep job holds out."""
    return f"val_{score}"


def fallback_objective(score: str = "accuracy") -> str:
    """The default objective where the data cannot be split (a tf.data callable without its own validation
    split): the task's score on the test set."""
    return f"test_{score}"

"""How a run that does not finish ends: its model discarded, its error worded for the user (RunLifecycle's two
hooks, runner.tracking.lifecycle)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

import tensorflow as tf

from runner.clusters.preemption import AgreedStop
from runner.clusters.roles import Task
from runner.errors import Preempted, RunnerError
from runner.outcome import resume_advice
from runner.tracking.protocol import Tracker
from runner.training.actions import LogModel
from runner.training.controller import Controller, EndAction
from runner.training.parts import Job, Restored

# What a collective or a remote op raises when another task of the cluster died or stopped answering.
_PEER_FAILURES = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.DeadlineExceededError)


@dataclass(frozen=True)
class RunEnding:
    """The run of `job`, started by `tracker` as `run_id`, trained by `controller` with `actions` at its end."""

    job: Job
    restored: Restored
    tracker: Tracker
    run_id: str | None
    actions: Sequence[EndAction]
    controller: Controller

    def discard_model(self) -> None:
        """A run that ends FAILED or KILLED keeps no model. Only a run past its last epoch can have one: logged by
        this invocation, or by an earlier one that had trained every epoch."""
        logged = any(isinstance(action, LogModel) and action.logged is not None for action in self.actions)
        trained_before = self.restored.done_epochs >= self.job.settings.epochs
        if self.job.task.chief and (logged or trained_before):
            from runner.tracking.model_export import discard_run_model  # noqa: PLC0415  MLflow: a run ending early

            tracking_uri = self.tracker.tracking_uri
            assert self.run_id is not None and tracking_uri is not None, "the chief's tracker has started the run"
            discard_run_model(tracking_uri, self.run_id)

    def explain(self, error: BaseException) -> BaseException:
        """`error` as the user should read it: a preemption's or a lost peer's paragraph, or the error itself."""
        task, checkpointer, run_dir = self.job.task, self.restored.checkpointer, self.job.run_dir
        again = resume_advice(run_dir, every_task=True)
        if isinstance(error, AgreedStop) and not task.chief:
            saved = os.path.join(checkpointer.directory, f"ckpt-{error.step}")
            return Preempted(
                f"{task.name} stopped at global step {error.step} for the preemption of {error.signalled} "
                f"(SIGTERM), in step with every worker; the chief saved {saved} and marks the job's MLflow "
                f"run KILLED and resumable: {again}"
            )
        if isinstance(error, AgreedStop):
            return Preempted(
                f"stopped at global step {error.step} for the preemption of {error.signalled} (SIGTERM), "
                f"every worker in step, after saving {checkpointer.latest}; MLflow run {self.run_id} is KILLED "
                f"and resumable: {again}"
            )
        if isinstance(error, Preempted):
            # No checkpoint: stopped before its first step, so nothing trained is lost and the re-run starts afresh.
            saved = f"after saving {checkpointer.latest}" if checkpointer.latest else "before its first step"
            return Preempted(
                f"stopped by SIGTERM {saved}; MLflow run {self.run_id} is "
                f"KILLED and resumable: {resume_advice(run_dir)}"
            )
        if isinstance(error, _PEER_FAILURES) and task.type is not None:  # one process: no peer to blame
            failure = _peer_failure(error, task, self.controller.epoch, checkpointer.latest, run_dir)
            # Free TensorFlow's frames now: they hold the thread pool of the aborted all-reduce, which would
            # otherwise be collected at interpreter exit and print its own traceback after our paragraph.
            error.__traceback__ = None
            return failure
        return error


def _peer_failure(
    error: tf.errors.OpError, task: Task, epoch: int | None, latest: str | None, run_dir: str
) -> RunnerError:
    """The one paragraph for a cluster that lost a task mid-run (TensorFlow's message names the task)."""
    reason = " ".join(re.sub(r"\{\{[^}]*\}\}", " ", _without_stack(error.message)).split())
    if len(reason) > 400:
        reason = reason[:400] + "..."
    kept = f"the checkpoints up to {latest} are kept" if latest else "no checkpoint had been written yet"
    return RunnerError(
        f"another task of the cluster failed or stopped answering "
        f"{f'during epoch {epoch}' if epoch else 'before training started'}, so {task.name} stopped "
        f"too ({type(error).__name__}: {reason}); {kept}. Fix: find the cause in the failed task's log, then "
        f"{resume_advice(run_dir, every_task=True)}, to resume from the last checkpoint."
    )


def _without_stack(message: str) -> str:
    """TensorFlow's own words: an error raised inside a tf.function starts with "Graph execution error:" and,
    per node, "Detected at node ... defined at (most recent call last):" and the Python stack that built
    it, which would fill the paragraph and push out the cause (the task that stopped answering)."""
    kept, in_stack = [], False
    for line in message.splitlines():
        if line.startswith("Detected at node "):
            in_stack = True
        elif in_stack and (not line.strip() or line.startswith(" ") or line == "<stack traces unavailable>"):
            pass
        elif line.strip() != "Graph execution error:":
            in_stack = False
            kept.append(line)
    return "\n".join(kept)

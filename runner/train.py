"""One training job, from validated settings to a finished MLflow run: its Trainer built part by part
(runner.training.build), then run (runner.training.trainer)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from runner.clusters.roles import SINGLE_PROCESS, Task
from runner.config.schema import Settings
from runner.tracking.protocol import Tracker
from runner.training.build import build_trainer
from runner.training.controller import Listener
from runner.training.parts import Job
from runner.training.trainer import RunResult


def run(
    settings: Settings,
    run_dir: str,
    tracker: Tracker,
    overrides: Sequence[str] = (),
    task: Task = SINGLE_PROCESS,
    listeners: Sequence[Listener] = (),
    on_result: Callable[[RunResult], None] | None = None,
) -> RunResult:
    """Train as configured, outputs in run_dir, tracked by `tracker` (runner.tracking.opening.open_tracker: the
    chief's MLflow run, a NullTracker elsewhere); `overrides` are the command line's, logged with the run;
    `listeners` hear of each epoch besides the tracker (an Optuna trial's reporter, which may stop training);
    `on_result` hears the result before the model's export and the run's end (runner.training.trainer.Trainer.run).

    A run_dir that holds checkpoints resumes from the newest one and continues the same MLflow run. In a cluster
    every MultiWorkerMirrored worker trains, and only the chief tracks, keeps checkpoints and evaluates the
    restored model; a non-chief's result has no run id.
    """
    os.makedirs(run_dir, exist_ok=True)
    return build_trainer(Job(settings, run_dir, task)).run(tracker, overrides, listeners, on_result)

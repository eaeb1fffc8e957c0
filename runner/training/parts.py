"""The parts of one job that both its build (runner.training.build) and its run (runner.training.trainer) read."""

from __future__ import annotations

from dataclasses import dataclass

from runner.clusters.roles import Task
from runner.config.schema import Settings
from runner.training.checkpoints import Checkpointer


@dataclass(frozen=True)
class Job:
    """What a job is asked for: its validated settings, the directory of its outputs and its task in the cluster."""

    settings: Settings
    run_dir: str
    task: Task


@dataclass(frozen=True)
class BatchPlan:
    """How the data is cut into steps: the global batch, the steps of an epoch, the effective learning rate (and
    how many MultiWorkerMirrored workers split the training set: 1, no split)."""

    global_batch: int
    steps_per_epoch: int
    learning_rate: float  # optimizer.lr scaled by lr_scaling
    input_workers: int


@dataclass(frozen=True)
class Restored:
    """The run directory's checkpoints, and how many epochs were restored from them (0: a fresh run)."""

    checkpointer: Checkpointer
    done_epochs: int

"""The cost of MLflow tracking: the runner's own tracker, timed on the calls the controller makes.

Measured in this process on the same kind of store the benchmark's runs use, with the runner's real
params and real checkpoint files, so the numbers are what a run spends in the tracker, without TensorFlow.
"""

from __future__ import annotations

import glob
import os
import statistics
import time
from dataclasses import dataclass
from types import SimpleNamespace

METRICS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "examples_per_second", "learning_rate")


@dataclass(frozen=True)
class TrackerCost:
    start_ms: float  # creating the run and logging its params, once per run
    epoch_ms: float  # the per-epoch metrics (median of `epochs` calls)
    checkpoint_ms: float  # logging one checkpoint's files as artifacts (median)
    checkpoint_bytes: int


def _timed_ms(call) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def measure_tracker(
    tracking_uri: str, run_dir: str, params: dict, checkpoint_dir: str, epochs: int = 10
) -> TrackerCost:
    from omegaconf import OmegaConf

    from runner.config.check import compose_config
    from runner.config.settings import mlflow_settings
    from runner.tracking.mlflow_tracker import MlflowTracker

    # mlflow.checkpoints=all: each save is logged as it is written, the most a run's checkpoints can cost.
    config = compose_config(
        [f"mlflow.tracking_uri={tracking_uri}", "mlflow.experiment_name=bench-tracker", "mlflow.checkpoints=all"]
    )
    tracker = MlflowTracker(mlflow_settings(OmegaConf.to_container(config, resolve=True)))
    os.makedirs(run_dir, exist_ok=True)
    start_ms = _timed_ms(lambda: tracker.start(run_dir, params))
    files = sorted(glob.glob(os.path.join(checkpoint_dir, "ckpt-*")))
    prefix = files[-1].split(".", 1)[0]  # the newest checkpoint's files, as Checkpointer.save returns them
    files = sorted(glob.glob(prefix + ".*")) + [os.path.join(checkpoint_dir, "checkpoint")]
    epoch_ms, checkpoint_ms = [], []
    for epoch in range(1, epochs + 1):
        result = SimpleNamespace(epoch=epoch, metrics=lambda: {key: 0.5 for key in METRICS})
        epoch_ms.append(_timed_ms(lambda result=result: tracker.on_epoch_end(result)))
        checkpoint_ms.append(_timed_ms(lambda epoch=epoch: tracker.on_checkpoint_saved(epoch, files)))
    tracker.finish()
    return TrackerCost(
        start_ms,
        statistics.median(epoch_ms),
        statistics.median(checkpoint_ms),
        sum(os.path.getsize(path) for path in files),
    )

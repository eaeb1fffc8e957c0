"""A sweep's runs written straight to a real MLflow store, without training: a parent run tagged as the sweep's
callback tags it and one child per (configuration, replicate) tagged as a sweep job tags its runs, each with a
per-epoch history. Fast enough for hundreds of runs; what the summary and the report read is all there."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from runner.sweeps.study.study import PRUNED_TAG
from runner.sweeps.terms import (
    CHOSEN_BY_TAG,
    CONFIGURATION_TAG,
    FOLD_TAG,
    JOB_NUMBER_TAG,
    OVERRIDES_TAG,
    SEED_TAG,
    SWEEP_DIR_TAG,
    SWEPT_KEYS_TAG,
)


def simulate_sweep(
    client: MlflowClient,
    sweep_dir: str,
    configurations: Mapping[str, Sequence[float | None]],
    epochs: int = 3,
    objective: str = "val_accuracy",
    pruned: Mapping[tuple[str, int], int] | None = None,
    tests: Mapping[str, float] | None = None,
) -> str:
    """A finished sweep over one key, `optimizer.lr`: configurations maps each configuration's value of it to its
    final objective per fold (fold k is the k-th value; None: that run FAILED). Each run's val_accuracy climbs
    to its final value over `epochs`; `pruned` maps (value, fold) to the epoch its run was pruned after; `tests`
    maps each test metric a finished run logs to its offset from the run's final objective (test_accuracy 0.01
    below it unless given). Returns the parent run id."""
    experiment = client.get_experiment_by_name("simulated") or None
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("simulated")
    parent_id = client.create_run(
        experiment_id,
        tags={SWEPT_KEYS_TAG: "optimizer.lr", SWEEP_DIR_TAG: sweep_dir, OVERRIDES_TAG: "optimizer.lr=choice"},
        run_name=sweep_dir,
    ).info.run_id
    now = int(time.time() * 1000)
    for number, (value, finals) in enumerate(configurations.items()):
        configuration = f"optimizer.lr={value}"
        for fold, final in enumerate(finals):
            tags = {
                MLFLOW_PARENT_RUN_ID: parent_id,
                JOB_NUMBER_TAG: str(number),
                CONFIGURATION_TAG: configuration,
                SEED_TAG: "42",
                FOLD_TAG: str(fold),
                CHOSEN_BY_TAG: objective,
            }
            stopped = (pruned or {}).get((value, fold))
            if stopped is not None:
                tags[PRUNED_TAG] = str(stopped)
            run = client.create_run(experiment_id, tags=tags, run_name=f"{configuration},fold={fold}", start_time=now)
            run_id = run.info.run_id
            reached = final if final is not None else 0.1
            last = stopped or epochs
            metrics = []
            for epoch in range(1, last + 1):
                share = epoch / epochs
                metrics += [
                    Metric(objective, reached * share, now + epoch, epoch),
                    Metric("val_loss", 2.0 * (1 - reached * share), now + epoch, epoch),
                    Metric("train_loss", 2.0 * (1 - reached * share) - 0.05, now + epoch, epoch),
                ]
            if final is not None and stopped is None:
                for key, offset in (tests or {"test_accuracy": -0.01}).items():
                    metrics.append(Metric(key, final + offset, now + epochs, epochs))
            client.log_batch(
                run_id,
                metrics=metrics,
                params=[Param("optimizer.lr", str(value)), Param("seed", "42")],
                tags=[RunTag("simulated", "true")],
            )
            client.set_terminated(run_id, "FAILED" if final is None else "FINISHED", end_time=now + 1000)
    client.set_tag(parent_id, CHOSEN_BY_TAG, objective)
    client.set_terminated(parent_id, "FINISHED")
    return parent_id


def sweep_config(sweep_dir: str, tracking_uri: str, *task: str, composed_with: Sequence[str] = ()):
    """The composed config of a sweep with `mlflow.tracking_uri` (and `composed_with`, e.g. `task=regression`), and
    Hydra's node as the sweep's callback sees it: the sweep directory, the command line's overrides `task` (e.g.
    `optimizer.lr=0.1,0.2`, recorded, not composed) and Hydra's basic sweeper."""
    from omegaconf import OmegaConf

    from helpers.config import compose
    from runner.sweeps.sweep_config import BASIC_SWEEPER

    composed = OmegaConf.to_container(compose([f"mlflow.tracking_uri={tracking_uri}", *composed_with]), resolve=True)
    hydra = {"sweep": {"dir": sweep_dir}, "overrides": {"task": list(task)}, "sweeper": {"_target_": BASIC_SWEEPER}}
    return OmegaConf.create({**composed, "hydra": hydra})

"""sweep.folds=K checked against the data before a sweep's parent run exists.

Whether data can be cut into K folds is known only from what its callable returns (a tf.data stream cannot be
split; file data folds by whole files, so it needs K files): the sweep loads the data once, as its first fold's
run would, so that such data is one paragraph and exit 2 rather than a FAILED child run for every fold of every
point.
"""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig

from runner.config.plain import as_dict, job_config
from runner.config.settings import checked_targets, sweep_settings, validate


def check_folds(config: DictConfig) -> None:
    """Refuse (RunnerError) the sweep's data if it cannot be cut into sweep.folds folds; nothing without folds.
    A point that sweeps the dataset itself is checked by its own runs."""
    folds = sweep_settings(config).folds
    if folds is None:
        return
    # TensorFlow, and the user's data module: only for a sweep that folds its data, once, before its jobs.
    from runner.data.loading import load_data  # noqa: PLC0415  TensorFlow: only for a sweep with sweep.folds

    settings = checked_targets(validate(as_dict(job_config(config))))
    first_fold = dataclasses.replace(settings.dataset, folds=folds, fold=0)
    load_data(first_fold, seed=settings.seed, task=settings.task.kind)

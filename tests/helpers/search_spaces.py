"""A custom search space (hydra.sweeper.custom_search_space) as a user writes one for Hydra's Optuna sweeper: a
function of the sweep's config and a trial that suggests parameters depending on those already drawn."""

from __future__ import annotations

from typing import Any

CALLS: list[Any] = []  # the configs it was called with, for a test to read


def batch_for_large_rates(config: Any, trial: Any) -> None:
    """A conditional parameter: a batch size drawn only for the trials whose learning rate is the larger one."""
    CALLS.append(config)
    if trial.params["optimizer.lr"] > 0.005:
        trial.suggest_categorical("batch", [32, 64])

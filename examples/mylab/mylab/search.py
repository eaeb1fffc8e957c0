"""A search space of one's own for an Optuna sweep (hydra.sweeper.custom_search_space, docs/sweeps.md): parameters
that depend on others, which Hydra's sweep syntax cannot say."""

from __future__ import annotations

from typing import Any


def momentum_for_sgd(config: Any, trial: Any) -> None:
    """Called with the sweep's config and each new trial, once the trial's `params` are drawn: an SGD trial also
    draws its momentum (passed to its job as `optimizer.momentum=<value>`); an Adam trial has none to draw."""
    if trial.params["optimizer"] == "sgd":
        trial.suggest_float("optimizer.momentum", 0.0, 0.99)

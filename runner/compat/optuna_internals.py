"""The private names of Optuna the runner uses, in one place; tests/test_compat.py fails, naming Optuna's version, when
one of them changes."""

from __future__ import annotations

from typing import Any


def trial_id(frozen: Any) -> int:
    """A FrozenTrial's id in its study's storage (`_trial_id`), which optuna.trial.Trial(study, id) takes to make a
    live trial of it: Optuna's public API gives a live trial only to the process that asked for it, and a sweep's
    job reports to the trial the sweeper asked."""
    return int(frozen._trial_id)

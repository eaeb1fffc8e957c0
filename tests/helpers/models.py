"""Model builders a test names as `model._target_` in a real `python -m runner` (tests/ on PYTHONPATH: TESTS_PATH)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

# What a process started by a test adds to PYTHONPATH to import `helpers.models`.
TESTS_PATH = str(Path(__file__).resolve().parents[1])


def model_that_raises(input_shape: Sequence[int], num_classes: int, weight_decay: float = 0.0):
    """A user's model whose builder fails: the run FAILED with this error, and nothing else."""
    raise RuntimeError(f"this model cannot be built for inputs {tuple(input_shape)}")

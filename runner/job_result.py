"""`result.json`: a finished training job's final numbers, written into its run directory.

It is how a training process hands its outcome to the sweep job that spawned it (runner.sweeps.job),
without that process having to parse logs or import TensorFlow.
"""

from __future__ import annotations

import json
import os
from typing import Any

RESULT_FILE = "result.json"
# The numbers a result holds; any of them can be a sweep's objective (sweep.objective).
RESULT_KEYS = (
    "train_loss",
    "train_accuracy",
    "test_loss",
    "test_accuracy",
    "eval_accuracy",
    "examples_per_second",
)


def write_result(run_dir: str, result) -> dict[str, Any]:
    """Write a runner.train.RunResult's final numbers to run_dir/result.json and return them.

    They come from the run's last logged value of each metric, so a resumed run that had no epoch
    left to train still reports the numbers of its last epoch."""
    values = {key: float(result.final_metrics[key]) for key in RESULT_KEYS if key != "eval_accuracy"}
    values["eval_accuracy"] = float(result.eval_accuracy)
    values["run_id"] = result.run_id
    with open(os.path.join(run_dir, RESULT_FILE), "w") as handle:
        json.dump(values, handle, indent=2)
        handle.write("\n")
    return values


def read_result(run_dir: str) -> dict[str, Any] | None:
    """The result a finished job wrote into run_dir, or None if it wrote none."""
    path = os.path.join(run_dir, RESULT_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return json.load(handle)

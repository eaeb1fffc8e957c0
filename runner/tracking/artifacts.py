"""What a run stores besides its metrics, by name: its model (the LoggedModel `model`, runs:/<run id>/model) and
its checkpoints (under the artifact path `checkpoints`), of which only the files still on disk are uploaded."""

from __future__ import annotations

import os

# A finished run's model: the LoggedModel of this name whose source run is the run (runs:/<run id>/model).
MODEL_NAME = "model"
# Where a run's checkpoint files go among its MLflow artifacts (mlflow.checkpoints says which).
CHECKPOINTS_ARTIFACT_PATH = "checkpoints"


def existing_files(paths: list[str]) -> list[str]:
    """The files of `paths` that are still there (a checkpoint may have been rotated away since it was saved)."""
    return [path for path in paths if os.path.isfile(path)]

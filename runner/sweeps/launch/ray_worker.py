"""What a sweep needs on a Ray worker (hydra/launcher=ray): the worker-process setup hook that prepares the process
as every entry point does and puts the job in the directory the command ran in, and the id of the Ray node a job
runs on, for its child run's tags."""

from __future__ import annotations

import os
import sys

from runner.entry import prepare_for_tensorflow

# Set by conf/hydra/launcher/ray.yaml's runtime_env: the sweep command's working directory.
COMMAND_DIR_VARIABLE = "RUNNER_COMMAND_DIR"
RAY_NODE_ID_TAG = "ray_node_id"


def enter_command_directory() -> None:
    """Prepare the worker as an entry point (runner.entry), then enter the command's directory.

    Ray starts workers in the directory of whoever started the raylet (`ray start`), not the command's, and
    Hydra places a job's directory relative to the worker's: without this the sweep directory, a
    sqlite:///mlflow.db and a relative dataset.dir would all mean other places on the worker."""
    prepare_for_tensorflow()
    directory = os.environ.get(COMMAND_DIR_VARIABLE)
    if directory:
        os.chdir(directory)


def ray_node_tags() -> dict[str, str]:
    """{ray_node_id: <node>} when this process is a Ray worker, else nothing. Ray is only looked at if this
    process already imported it (a Ray worker has), so other launchers never pay for importing it."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return {}
    return {RAY_NODE_ID_TAG: ray.get_runtime_context().get_node_id()}

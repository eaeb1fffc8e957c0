"""The end-of-job protocol of a parameter_server cluster: the chief writes how it ended into END_FILE in the run
directory every task shares, and the servers, which TensorFlow never tells that training is over, read it.

The servers then end by themselves (runner.clusters.serving), with status 0 when the chief finished, so the
job (a SLURM job, a Kubernetes TFJob) ends as the chief did.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from runner.clusters.roles import Task
from runner.config.schema import Settings
from runner.errors import Preempted
from runner.strategy_kinds import strategy_kind

# Written by the chief into the run directory when it is done with the servers: {"token", "outcome"}.
END_FILE = "cluster_end.json"
# The status a server ends with for each way the chief ended.
SERVER_EXIT = {"finished": 0, "preempted": 128 + signal.SIGTERM, "failed": 1}


def read_end(path: str) -> dict | None:
    """The chief's END_FILE, or None while there is none (or it is being replaced)."""
    try:
        with open(path) as handle:
            end = json.load(handle)
    except (OSError, ValueError):  # none yet, or being replaced
        return None
    return end if isinstance(end, dict) else None


@contextmanager
def telling_servers_the_end(task: Task, settings: Settings, run_dir: str) -> Iterator[None]:
    """Around the chief's training: write END_FILE with how it ended (finished, preempted, failed), so
    that the servers of a parameter_server cluster end too."""
    if not (task.chief and task.type is not None and strategy_kind(settings.strategy.name).coordinated):
        yield
        return
    ending = "failed"
    try:
        yield
        ending = "finished"
    except Preempted:
        ending = "preempted"
        raise
    finally:
        # Free the coordinator and the functions it placed on the servers while they still answer: freed
        # at exit, after the servers ended, each would log an error that its server is gone.
        gc.collect()
        path = os.path.join(run_dir, END_FILE)
        # A new token each time: the servers of a later run in this directory tell it from this one.
        with open(path + ".tmp", "w") as handle:
            json.dump({"token": uuid.uuid4().hex, "outcome": ending}, handle)
        os.replace(path + ".tmp", path)

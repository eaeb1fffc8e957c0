"""Preempting the tasks of a running cluster and reading what they said and saved.

`Task` is one `python -m runner` in the background whose output (logs and the closing paragraph) is read as it
comes; the other functions read the words a preempted task ends with and the checkpoints it left.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from helpers.cli import cli_env
from helpers.processes import children, is_running
from helpers.waiting import exited, wait_for

T = TypeVar("T")


class Task:
    """`python -m runner <args>` in the background, stdout and stderr merged and collected line by line."""

    def __init__(self, *args: str, cwd: Path, env: dict[str, str] | None = None):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "runner", *args],
            cwd=cwd,
            env=cli_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self._reader.start()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_until(self, condition: Callable[[], T], what: str, timeout: float = 240) -> T:
        """Until `condition` holds (its value); fails, with the output's tail, if the process ends first."""
        return wait_for(condition, timeout, what, unless=exited(self.process), detail=lambda: self.output[-3000:])

    def wait_for(self, text: str, timeout: float = 240) -> None:
        """Until a line holds `text`; fails if the process ends first."""
        self.wait_until(lambda: any(text in line for line in self.lines), repr(text), timeout)

    def finish(self, timeout: float = 240) -> str:
        self.process.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return self.output

    def stop(self) -> None:
        """Kill it if it still runs (a failed test's way out)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)


def cluster_tasks(launcher_pid: int) -> dict[str, int]:
    """The tasks a cluster=local launcher started, by TF_CONFIG's name ("worker 0": pid)."""
    found = {}
    for pid in children(launcher_pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                variables = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
        except OSError:
            continue
        if b"TF_CONFIG" in variables:
            task = json.loads(variables[b"TF_CONFIG"])["task"]
            found[f"{task['type']} {task['index']}"] = pid
    return found


def any_alive(pids) -> list[int]:
    return [pid for pid in pids if is_running(pid)]


def chief_stop(output: str, signalled: str | None = None) -> int:
    """The global step N of the chief's closing paragraph "preempted: stopped at global step N for the preemption
    of <signalled> ..., after saving .../ckpt-N; ..." (exactly one such line). `signalled` None: any task (every
    task got the SIGTERM, and the first the cluster heard of is named)."""
    [words] = [line for line in output.splitlines() if "preempted: stopped at global step" in line]
    step = int(re.search(r"global step (\d+)", words).group(1))
    assert re.search(f"for the preemption of {_task(signalled)} \\(SIGTERM\\), every worker in step", words), words
    assert f"ckpt-{step};" in words and "is KILLED and resumable" in words, words
    return step


def assert_worker_words(output: str, worker: str, step: int, checkpoints: Path, signalled: str | None = None) -> None:
    """The non-chief's closing paragraph says what it did: it stopped at the agreed step for the preemption of
    the task that got the signal (`signalled`; None: any), and the chief saved that step's checkpoint."""
    expected = (
        f"preempted: {worker} stopped at global step {step} for the preemption of {_task(signalled)} "
        f"\\(SIGTERM\\), in step with every worker; the chief saved {re.escape(str(checkpoints / f'ckpt-{step}'))} "
        "and marks the job's MLflow run KILLED and resumable"
    )
    assert re.search(expected, output), output[-3000:]


def _task(name: str | None) -> str:
    return re.escape(name) if name else "(the chief|worker \\d+)"


def checkpoint_step(path: Path) -> int:
    return int(path.name[len("ckpt-") : -len(".index")])


def checkpoints(run_dir: Path) -> list[Path]:
    """The index files of a run directory's checkpoints, oldest first (by step: ckpt-128 is newer than ckpt-64)."""
    return sorted((run_dir / "checkpoints").glob("ckpt-*.index"), key=checkpoint_step)


def latest_checkpoint(run_dir: Path) -> Path:
    """The newest checkpoint of a run directory, without its .index suffix."""
    return checkpoints(run_dir)[-1].with_suffix("")


def model_weights(checkpoint: Path) -> dict[str, bytes]:
    """The model's variables in a checkpoint, as raw bytes to compare bit for bit."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(checkpoint))
    return {
        name: reader.get_tensor(name).tobytes()
        for name in reader.get_variable_to_shape_map()
        if name.startswith("model/") and not name.endswith("OPTIMIZER_SLOT")
    }

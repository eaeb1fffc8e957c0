"""Running one benchmarked command: its output, and when a marker line appeared after the command started.

The first-step time is taken from outside, the same way for the reference and the runner: from just
before the process is spawned to the moment the line announcing the first completed step reaches us.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Finished:
    output: str
    first_step_seconds: float | None  # None when the marker never appeared
    wall_seconds: float
    peak_rss_mb: float | None = None  # the process's peak resident memory (its own, not its children's)


class CommandFailed(RuntimeError):
    pass


def bench_env(extra: tuple[str, ...] = ()) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)  # every runner run names its store explicitly
    return {**env, **dict(item.split("=", 1) for item in extra)}


def run_timed(command: list[str], marker: str, cwd: str, timeout: float, env: tuple[str, ...] = ()) -> Finished:
    """Run `command` to completion with `env` (NAME=value) added to the environment; stdout and stderr
    are read as one stream, line by line."""
    started = time.perf_counter()
    first_step = None
    lines = []
    with subprocess.Popen(
        command, cwd=cwd, env=bench_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as process:
        # Text mode reads tqdm's carriage-return redraws as lines too, so the pipe never fills up.
        for line in process.stdout:
            if first_step is None and marker in line:
                first_step = time.perf_counter() - started
            lines.append(line)
            if time.perf_counter() - started > timeout:
                process.kill()
                raise CommandFailed(f"timed out after {timeout:.0f} s: {' '.join(command)}")
        # wait4 reports the peak RSS of this one process (getrusage(RUSAGE_CHILDREN) is the largest of all).
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = code = os.waitstatus_to_exitcode(status)
    output = "".join(lines)
    if code != 0:
        raise CommandFailed(f"exit status {code}: {' '.join(command)}\n{output[-3000:]}")
    return Finished(output, first_step, time.perf_counter() - started, usage.ru_maxrss / 1024)

"""Progress on the terminal: a tqdm bar per epoch (steps, current loss), a summary line per epoch, and
one line when the first training step has completed (start-up time, logged with or without the bar).

The bar redraws its line with carriage returns, which only a terminal turns back into one line: by default
(`progress=null`, tqdm's `disable=None` convention) it is drawn only when stderr is a terminal."""

from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import nullcontext

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

log = logging.getLogger("runner")

# Reading the loss forces the host to wait for the device: do it only when the bar redraws.
_LOSS_REFRESH_SECONDS = 0.5
FIRST_STEP_MESSAGE = "first training step done"


def seconds_since_process_start() -> float | None:
    """Wall-clock seconds since this process was started (interpreter start-up included), on Linux;
    None where /proc does not say."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            # Field 22 is the start time in clock ticks after boot; the command name (field 2) may hold spaces.
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            booted_seconds = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return booted_seconds - started_ticks / os.sysconf("SC_CLK_TCK")


# When a warm sweep worker took the run it trains now (runner.warm_worker): its first step is timed from then.
_run_taken: list[float] = []


def mark_run_taken() -> None:
    """In a warm worker, as it takes a run: the first step's log line counts from now, not from the process's start."""
    _run_taken[:] = [time.monotonic()]


def _since_start() -> tuple[float | None, str]:
    """Seconds since this run's process started (or its warm worker took it), and those words."""
    if _run_taken:
        return time.monotonic() - _run_taken[0], "the warm worker took the run"
    return seconds_since_process_start(), "the process started"


def bar_enabled(setting: bool | None, stream=None) -> bool:
    """The `progress` setting for this process: true and false as given, null when `stream` (stderr) is a
    terminal."""
    if setting is not None:
        return setting
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no stream, or a closed one
        return False


class EpochProgress:
    def __init__(self, epochs: int, enabled: bool | None = True):
        self.epochs = epochs
        self.enabled = bar_enabled(enabled)
        self._bar = None
        self._last_refresh = 0.0
        self._first_step_done = False

    def start_epoch(self, epoch: int, steps: int | None) -> None:
        if self.enabled:
            self._bar = tqdm(
                total=steps, desc=f"epoch {epoch}/{self.epochs}", unit="step", leave=False, dynamic_ncols=True
            )

    def advance(self, steps: int, loss) -> None:
        if not self._first_step_done:
            self._log_first_step(steps, loss)
        if self._bar is None:
            return
        self._bar.update(steps)
        now = time.monotonic()
        if now - self._last_refresh >= _LOSS_REFRESH_SECONDS:
            self._last_refresh = now
            self._bar.set_postfix(loss=f"{float(loss):.4f}", refresh=False)

    def _log_first_step(self, steps: int, loss) -> None:
        # Reading the loss waits for the step itself, not only its dispatch; once per run, so it is free.
        float(loss)
        self._first_step_done = True
        since_start, start = _since_start()
        # Written through tqdm while the bar is on screen, so that the line does not run on from the bar.
        with logging_redirect_tqdm() if self._bar is not None else nullcontext():
            log.info(
                "%s%s%s",
                FIRST_STEP_MESSAGE,
                f" ({steps} steps in the first call)" if steps > 1 else "",
                "" if since_start is None else f", {since_start:.1f} s after {start}",
            )

    def end_epoch(self, result) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        measured = ", ".join(f"{key} {value:.4f}" for key, value in result.model_metrics.items())
        log.info(
            "epoch %d/%d: %s, %.0f examples/s, lr %.3g",
            result.epoch,
            self.epochs,
            measured,
            result.examples_per_second,
            result.learning_rate,
        )

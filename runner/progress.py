"""Progress on the terminal: a tqdm bar per epoch (steps, current loss) and a summary line per epoch."""

from __future__ import annotations

import logging
import time

from tqdm import tqdm

log = logging.getLogger("runner")

# Reading the loss forces the host to wait for the device: do it only when the bar redraws.
_LOSS_REFRESH_SECONDS = 0.5


class EpochProgress:
    def __init__(self, epochs: int, enabled: bool = True):
        self.epochs = epochs
        self.enabled = enabled
        self._bar = None
        self._last_refresh = 0.0

    def start_epoch(self, epoch: int, steps: int | None) -> None:
        if self.enabled:
            self._bar = tqdm(total=steps, desc=f"epoch {epoch}/{self.epochs}", unit="step",
                             leave=False, dynamic_ncols=True)

    def advance(self, steps: int, loss) -> None:
        if self._bar is None:
            return
        self._bar.update(steps)
        now = time.monotonic()
        if now - self._last_refresh >= _LOSS_REFRESH_SECONDS:
            self._last_refresh = now
            self._bar.set_postfix(loss=f"{float(loss):.4f}", refresh=False)

    def end_epoch(self, result) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        log.info(
            "epoch %d/%d: train_loss %.4f, train_accuracy %.4f, test_loss %.4f, test_accuracy %.4f, "
            "%.0f examples/s, lr %.3g",
            result.epoch, self.epochs, result.train_loss, result.train_accuracy, result.test_loss,
            result.test_accuracy, result.examples_per_second, result.learning_rate,
        )

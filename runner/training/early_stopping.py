"""Early stopping (`early_stopping.patience`) and the best epoch's weights (`checkpoint.keep_best`): Keras'
EarlyStopping(restore_best_weights=True) for the custom loop. After each epoch the watched metric
(`early_stopping.monitor`) either improves on the best so far by more than `min_delta`, or the epochs without
improvement grow by one; once they reach `patience`, training stops after that epoch and the run ends FINISHED,
tagged `best_epoch` and `stopped_at_epoch`. With keep_best, the model's weights at each improvement are copied aside,
and the evaluation at the run's end and the logged model use them.

The state (the best value, its epoch, the epochs without improvement, the best weights) is a checkpointed part of
the run (`Checkpointer(extra=...)`), saved in the same file as the epoch it belongs to, so a resumed run stops where
the uninterrupted one would and hands over the same weights. Every task of a MultiWorkerMirrored cluster computes the
same state from the same all-reduced metrics, and the controller's agreement makes the stop every task's; under
ParameterServer the coordinator, which alone runs the loop, decides.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import tensorflow as tf

from runner.config.schema import CheckpointSettings, EarlyStoppingSettings
from runner.config.settings import refuse_test_monitor
from runner.errors import RunnerError
from runner.metric_table import DEFAULT_TABLE, MetricTable
from runner.outcome import BEST_EPOCH_TAG, STOPPED_AT_EPOCH_TAG

if TYPE_CHECKING:
    from runner.training.controller import EpochResult

log = logging.getLogger("runner")

DEFAULT_MONITOR = "val_loss"


@dataclass(frozen=True)
class Watch:
    """What is watched, how: the metric, its direction, the patience (None: never stop), the least improvement, the
    first epoch that counts, and whether the best epoch's weights are kept."""

    monitor: str
    lower_is_better: bool
    patience: int | None
    min_delta: float
    start_epoch: int
    keep_best: bool


def watch_of(
    settings: EarlyStoppingSettings,
    checkpoint: CheckpointSettings,
    objective: str | None,
    has_validation: bool,
    table: MetricTable = DEFAULT_TABLE,
) -> Watch | None:
    """The run's watch (None: neither early stopping nor keep_best), its monitor resolved: early_stopping.monitor,
    else a per-epoch sweep.objective, else val_loss. A val_* monitor on data without a validation split is one
    paragraph, before the run exists."""
    keep_best = checkpoint.keep_best if checkpoint.keep_best is not None else settings.patience is not None
    if settings.patience is None and not keep_best:
        return None
    monitor = settings.monitor or (objective if objective in table.epoch_keys() else None) or DEFAULT_MONITOR
    refuse_test_monitor(
        monitor,
        f"early_stopping.monitor={monitor!r}"
        if settings.monitor
        else f"early_stopping.monitor (null: sweep.objective={monitor})",
    )
    if monitor.startswith("val_") and not has_validation:
        named = f"early_stopping.monitor={monitor}" if settings.monitor else f"early_stopping.monitor (null: {monitor})"
        raise RunnerError(
            f"{named} is not valid: this run has no validation split, so it has no {monitor} to watch. Fix: hold one "
            "out with dataset.validation_fraction=0.1 (or give the dataset a validation split of its own), or watch "
            "another metric, e.g. early_stopping.monitor=train_loss (the test set's metrics would choose the epoch "
            "on the data that reports the result).",
            key="early_stopping.monitor",
        )
    return Watch(
        monitor,
        table.lower_is_better(monitor),
        settings.patience,
        settings.min_delta,
        settings.start_epoch,
        keep_best,
    )


class EarlyStopping(tf.Module):
    """The state of one run's watch, its variables checkpointed with the run. `model`: whose weights are kept.

    A listener of the controller (runner.training.controller.StopsTraining) that `finishes` the run: after each
    epoch it takes the epoch's metrics in, and asks training to stop once the patience has run out."""

    finishes = True  # a run early stopping ends is done: FINISHED, its end actions run

    def __init__(self, watch: Watch, model: tf.keras.Model):
        super().__init__(name="early_stopping")
        self.watch = watch
        self.model = model
        self.best = tf.Variable(math.nan, dtype=tf.float64, trainable=False, name="best")
        self.best_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="best_epoch")
        self.waited = tf.Variable(0, dtype=tf.int64, trainable=False, name="epochs_without_improvement")
        # The weights of the best epoch, in the order of model.weights (a model built the same way has that order).
        self.best_weights = (
            [tf.Variable(weight, trainable=False, name="best_weight") for weight in model.weights]
            if watch.keep_best
            else []
        )

    def _improves(self, value: float) -> bool:
        best = float(self.best.numpy())
        if math.isnan(best):
            return not math.isnan(value)
        if self.watch.lower_is_better:
            return value < best - self.watch.min_delta
        return value > best + self.watch.min_delta

    def after_epoch(self, epoch: int, metrics: dict[str, float]) -> bool:
        """Take the epoch's metrics in (and its weights, if they are the best yet); whether training stops after
        this epoch."""
        if epoch < self.watch.start_epoch:
            return False
        value = metrics[self.watch.monitor]
        if self._improves(value):
            self.best.assign(value)
            self.best_epoch.assign(epoch)
            self.waited.assign(0)
            if self.best_weights:
                for kept, weight in zip(self.best_weights, self.model.weights, strict=True):
                    kept.assign(weight)
            return False
        self.waited.assign_add(1)
        if not self.stopped:
            return False
        log.info(
            "early stopping: %s has not improved for %d epoch(s) on its best, %.6g after epoch %d; training stops "
            "after epoch %d",
            self.watch.monitor,
            int(self.waited.numpy()),
            float(self.best.numpy()),
            int(self.best_epoch.numpy()),
            epoch,
        )
        return True

    def on_epoch_end(self, result: EpochResult) -> None:
        self.after_epoch(result.epoch, result.metrics())

    def on_checkpoint_saved(self, epoch: int, files: list[str]) -> None:
        pass

    @property
    def stop_requested(self) -> bool:
        return self.stopped

    @property
    def stopped(self) -> bool:
        """Whether the epochs without improvement have reached the patience (a run restored in this state has
        stopped already: it trains no further epoch)."""
        waited = int(self.waited.numpy())
        return self.watch.patience is not None and waited > 0 and waited >= self.watch.patience

    def restore_best_into(self, model: tf.keras.Model) -> int | None:
        """With keep_best, the best epoch's weights assigned to `model` (built as the trained one was): that
        epoch; None without keep_best or before any epoch counted."""
        epoch = int(self.best_epoch.numpy())
        if not self.best_weights or epoch == 0:
            return None
        for weight, kept in zip(model.weights, self.best_weights, strict=True):
            weight.assign(kept)
        return epoch

    def tags(self, last_epoch: int) -> dict[str, str]:
        """The run's tags once training has ended: its best epoch, and, if it stopped early, the epoch it stopped
        after (`last_epoch`, the last it trained)."""
        tags = {BEST_EPOCH_TAG: str(int(self.best_epoch.numpy()))}
        if self.stopped:
            tags[STOPPED_AT_EPOCH_TAG] = str(last_epoch)
        return tags

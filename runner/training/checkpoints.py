"""Checkpoints through tf.train.Checkpoint/CheckpointManager, and the tutorial's last section:
restore the latest checkpoint into a fresh model without a strategy and evaluate it."""

from __future__ import annotations

import glob
import logging
import os
import tempfile

import tensorflow as tf

from runner.errors import RunnerError
from runner.settings import CheckpointSettings
from runner.training.steps import TrainingState

log = logging.getLogger("runner")


class Checkpointer:
    """Checkpoints named by global step (ckpt-<optimizer.iterations>), each holding the epoch counter."""

    def __init__(self, directory: str, state: TrainingState, settings: CheckpointSettings, epochs: int,
                 scratch: bool = False):
        self.directory = directory
        # A MultiWorkerMirrored worker other than the chief must take part in every save, but only the
        # chief's checkpoint is kept: a scratch checkpointer writes into a temporary directory removed
        # right after, and reads (resumes) from the chief's `directory`.
        self.scratch = scratch
        self.state = state
        self.every_epochs = settings.every_epochs
        self.epochs = epochs
        self.checkpoint = tf.train.Checkpoint(model=state.model, optimizer=state.optimizer, epoch=state.epoch)
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=settings.max_to_keep)

    def due(self, epoch: int) -> bool:
        """Every `every_epochs` epochs, and always after the last one so the final model is kept."""
        return epoch % self.every_epochs == 0 or epoch == self.epochs

    def save(self) -> list[str]:
        """Save (unless the latest checkpoint is of this very step) and return the checkpoint's files."""
        step = int(self.state.optimizer.iterations.numpy())
        if self.scratch:
            with tempfile.TemporaryDirectory(prefix="runner-ckpt-") as scratch:
                tf.train.CheckpointManager(self.checkpoint, scratch, max_to_keep=1).save(checkpoint_number=step)
            return []
        prefix = self.manager.latest_checkpoint
        if prefix is None or not prefix.endswith(f"-{step}"):
            prefix = self.manager.save(checkpoint_number=step)
        return sorted(glob.glob(prefix + ".*")) + [os.path.join(self.directory, "checkpoint")]

    @property
    def latest(self) -> str | None:
        return self.manager.latest_checkpoint

    @property
    def exists(self) -> bool:
        return bool(self.manager.checkpoints)

    def restore(self) -> int:
        """Restore the newest readable checkpoint; return its epoch (0 when there is none).

        TensorFlow only lists a checkpoint once all its files are written, and an unreadable newest
        one (a damaged disk, a copy cut short) falls back to the one before.
        """
        for path in reversed(self.manager.checkpoints):
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
            except (tf.errors.DataLossError, tf.errors.NotFoundError, tf.errors.OutOfRangeError) as error:
                log.warning("checkpoint %s is unreadable (%s); trying the one before", path, type(error).__name__)
                continue
            except (ValueError, AssertionError) as error:
                raise RunnerError(
                    f"the checkpoint {path} does not fit this model ({str(error).splitlines()[0][:300]}): it "
                    "was written by a run with another model or configuration. Fix: pick a new hydra.run.dir "
                    "for this configuration, or re-run with the overrides that wrote that directory."
                ) from None
            return int(self.state.epoch.numpy())
        return 0


def evaluate_without_strategy(checkpoint_path: str, build_model, test_dataset: tf.data.Dataset) -> float:
    """Accuracy of the checkpointed model, restored into a fresh model outside any strategy."""
    with tf.distribute.get_strategy().scope():  # the default strategy, whatever the run used
        model = build_model()
        tf.train.Checkpoint(model=model).restore(checkpoint_path).expect_partial()
        accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="eval_accuracy")

    @tf.function
    def eval_step(images, labels):
        accuracy.update_state(labels, model(images, training=False))

    for images, labels in test_dataset:
        eval_step(images, labels)
    return float(accuracy.result())

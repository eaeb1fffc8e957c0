"""Checkpoints through tf.train.Checkpoint/CheckpointManager, and the tutorial's last section:
restore the latest checkpoint into a fresh model without a strategy and evaluate it."""

from __future__ import annotations

import glob
import os

import tensorflow as tf

from runner.settings import CheckpointSettings
from runner.steps import TrainingState


class Checkpointer:
    def __init__(self, directory: str, state: TrainingState, settings: CheckpointSettings, epochs: int):
        self.directory = directory
        self.every_epochs = settings.every_epochs
        self.epochs = epochs
        self.checkpoint = tf.train.Checkpoint(model=state.model, optimizer=state.optimizer, epoch=state.epoch)
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=settings.max_to_keep)

    def due(self, epoch: int) -> bool:
        """Every `every_epochs` epochs, and always after the last one so the final model is kept."""
        return epoch % self.every_epochs == 0 or epoch == self.epochs

    def save(self, epoch: int) -> list[str]:
        """Save and return the files that make up this checkpoint (plus the `checkpoint` index file)."""
        prefix = self.manager.save(checkpoint_number=epoch)
        return sorted(glob.glob(prefix + ".*")) + [os.path.join(self.directory, "checkpoint")]

    @property
    def latest(self) -> str | None:
        return self.manager.latest_checkpoint


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

"""The cadence of training: epochs, evaluation, checkpoints, and the events other parts listen to.

The controller owns *when* things happen; what happens inside a step belongs to steps.py and loop.py,
and side effects (MLflow, progress) are listeners called with each epoch's result.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Protocol

import tensorflow as tf

from runner.optimizer import current_learning_rate
from runner.steps import TrainingState


@dataclass(frozen=True)
class EpochResult:
    epoch: int
    train_loss: float
    train_accuracy: float
    test_loss: float
    test_accuracy: float
    examples_per_second: float
    learning_rate: float
    steps: int
    examples: int
    train_seconds: float

    def metrics(self) -> dict[str, float]:
        """The per-epoch metrics logged to MLflow."""
        values = asdict(self)
        return {key: values[key] for key in (
            "train_loss", "train_accuracy", "test_loss", "test_accuracy", "examples_per_second", "learning_rate")}


class Listener(Protocol):
    def on_epoch_end(self, result: EpochResult) -> None: ...
    def on_checkpoint_saved(self, epoch: int, files: list[str]) -> None: ...


class Controller:
    def __init__(self, state: TrainingState, loop, evaluate, checkpointer, progress, listeners, epochs: int):
        self.state = state
        self.loop = loop
        self.evaluate = evaluate
        self.checkpointer = checkpointer
        self.progress = progress
        self.listeners = list(listeners)
        self.epochs = epochs

    def train_one_epoch(self, epoch: int) -> EpochResult:
        state = self.state
        state.reset_metrics()
        self.progress.start_epoch(epoch, self.loop.steps_per_epoch)
        started = time.perf_counter()
        total_loss, steps = self.loop.train_epoch(self.progress)
        train_loss = float(total_loss) / steps  # float() waits for the last step to finish
        train_seconds = time.perf_counter() - started
        examples = int(state.train_accuracy.count.numpy())
        self.evaluate()
        state.epoch.assign(epoch)
        result = EpochResult(
            epoch=epoch,
            train_loss=train_loss,
            train_accuracy=float(state.train_accuracy.result()),
            test_loss=float(state.test_loss.result()),
            test_accuracy=float(state.test_accuracy.result()),
            examples_per_second=examples / train_seconds,
            learning_rate=current_learning_rate(state.optimizer),
            steps=steps,
            examples=examples,
            train_seconds=train_seconds,
        )
        self.progress.end_epoch(result)
        return result

    def run(self) -> list[EpochResult]:
        history = []
        for epoch in range(int(self.state.epoch.numpy()) + 1, self.epochs + 1):
            result = self.train_one_epoch(epoch)
            history.append(result)
            for listener in self.listeners:
                listener.on_epoch_end(result)
            if self.checkpointer.due(epoch):
                files = self.checkpointer.save(epoch)
                for listener in self.listeners:
                    listener.on_checkpoint_saved(epoch, files)
        return history


def make_evaluate(steps, dist_test_dataset):
    """The tutorial's test pass: a tf.function test step per distributed batch."""
    test_step = tf.function(steps.distributed_test_step)

    def evaluate() -> None:
        for inputs in dist_test_dataset:
            test_step(inputs)

    return evaluate

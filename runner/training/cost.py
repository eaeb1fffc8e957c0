"""What a trained model costs, measured once its training has ended and logged as the metric table's cost rows
(runner.metric_table.COST): its parameters, how fast the served model answers, and how long it trained. The
exported model's size (`model_bytes`) is logged with the model itself (runner.training.actions.LogModel).

The served model's speed is measured on the restored model behind the task's raw-input export (what the logged
model serves), called as its SavedModel signature calls it (one `tf.function`), on one batch of the test split's
raw inputs (`cost.latency_batch` of them, or the whole split where it is smaller): two calls to warm it up (the
first traces it), then `cost.latency_repeats` timed calls, of which the median is taken."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from runner.metric_table import (
    LATENCY_MS,
    PARAMETERS,
    SERVED_EXAMPLES_PER_SECOND,
    THROUGHPUT,
    TRAINABLE_PARAMETERS,
    TRAINING_SECONDS,
)
from runner.tracking.protocol import Tracker
from runner.training.actions import RestoreAndEvaluate, unlogged
from runner.training.controller import EpochResult

log = logging.getLogger("runner")

WARM_UP_CALLS = 2  # the first call traces the function; the second runs it as every later call does


@dataclass(frozen=True)
class ServingSpeed:
    """The served model's median time for one batch, as the time per example and the examples per second."""

    batch: int
    seconds: float  # the median over the timed calls of one call on the whole batch

    @property
    def latency_ms(self) -> float:
        return self.seconds / self.batch * 1000.0

    @property
    def examples_per_second(self) -> float:
        return self.batch / self.seconds


def parameter_counts(model: tf.keras.Model) -> dict[str, float]:
    """The model's parameters, all (`model.count_params()`) and trainable."""
    trainable = sum(int(np.prod(weight.shape)) for weight in model.trainable_weights)
    return {PARAMETERS: float(model.count_params()), TRAINABLE_PARAMETERS: float(trainable)}


def serving_speed(served: tf.keras.Model, raw_inputs: Any, repeats: int) -> ServingSpeed:
    """`served` (raw inputs in, what the task serves out) called on `raw_inputs` as one batch: warmed up, then the
    median of `repeats` timed calls, each waited for until its outputs are on the host."""
    serve = tf.function(lambda raw: served(raw, training=False))
    batch = tf.convert_to_tensor(raw_inputs)
    for _ in range(WARM_UP_CALLS):
        np.asarray(serve(batch))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        np.asarray(serve(batch))
        times.append(time.perf_counter() - started)
    return ServingSpeed(int(batch.shape[0]), statistics.median(times))


def training_seconds(history: Sequence[EpochResult], throughput: Sequence[tuple[int, float]], examples: int) -> float:
    """The seconds the run's epochs took to train: each epoch this invocation trained by its own clock, each epoch
    an earlier invocation trained (a resumed run) as a whole epoch's `examples` over its logged examples_per_second
    (`throughput`: (epoch, examples per second))."""
    trained_now = {result.epoch: result.train_seconds for result in history}
    earlier = sum(examples / speed for epoch, speed in throughput if epoch not in trained_now and speed > 0)
    return sum(trained_now.values()) + earlier


class MeasureCost:
    """The end action that logs what the restored model costs (runner.metric_table.COST but model_bytes) at the step
    of its weights' epoch, as the eval_* scores are: after RestoreAndEvaluate, whose model it measures."""

    def __init__(
        self,
        restored: RestoreAndEvaluate,
        export: Callable[[tf.keras.Model], tf.keras.Model],
        raw_inputs: Callable[[], Any],
        tracker: Tracker,
        epoch_examples: int,
        repeats: int,
    ):
        self.restored = restored
        self.export = export  # the task's raw-input export (runner.training.task.Experiment.export_model)
        self.raw_inputs = raw_inputs  # the served model's batch, as the test split holds it
        self.tracker = tracker
        self.epoch_examples = epoch_examples  # the examples of one whole epoch (the global batch x its steps)
        self.repeats = repeats
        self.costs: dict[str, float] = {}

    def __call__(self, history: list[EpochResult]) -> None:
        model = self.restored.model
        assert model is not None, "RestoreAndEvaluate runs first"
        speed = serving_speed(self.export(model), self.raw_inputs(), self.repeats)
        throughput = self.tracker.metric_histories().get(THROUGHPUT, [])
        self.costs = {
            **parameter_counts(model),
            LATENCY_MS: speed.latency_ms,
            SERVED_EXAMPLES_PER_SECOND: speed.examples_per_second,
            TRAINING_SECONDS: training_seconds(history, throughput, self.epoch_examples),
        }
        step = self.restored.epoch
        self.tracker.log_metrics(unlogged(self.tracker, self.costs, step, self.restored.continued), step=step)
        log.info(
            "the model's cost: %d parameters (%d trainable); served in %.3f ms per example at a batch of %d "
            "(%.0f examples/s); trained in %.1f s",
            self.costs[PARAMETERS],
            self.costs[TRAINABLE_PARAMETERS],
            speed.latency_ms,
            speed.batch,
            speed.examples_per_second,
            self.costs[TRAINING_SECONDS],
        )

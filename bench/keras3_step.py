"""The training step of the built-in CNN in each Keras lane, timed in one process: tf_keras (runtime.keras=2)
against Keras 3 (runtime.keras=3), the runner's own step (runner.training.steps.ReplicaSteps) on one batch of 64
already drawn, OneDeviceStrategy, and its parts (forward pass, forward and backward, the optimizer's update, the
loss). Both lanes are built in the same process and timed in alternating rounds, so that the machine's load hits
them alike: `python -m bench.keras3_step`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from runner.entry import prepare_for_tensorflow

prepare_for_tensorflow()

import numpy as np  # noqa: E402 (after TensorFlow's environment is set)
import tensorflow as tf  # noqa: E402

from bench.step_costs import interleaved_us  # noqa: E402
from runner.builtins import keras_lane, losses, models, optimizers  # noqa: E402
from runner.training.steps import ReplicaSteps, TrainingState  # noqa: E402

BATCH = 64
PARTS = ("the whole step", "forward pass", "forward and backward", "optimizer update", "per-example loss")


def lane_calls(keras: int, strategy: tf.distribute.Strategy, images, labels) -> dict[str, Callable[[], object]]:
    """The step and its parts for the CNN built in Keras `keras`, each a traced tf.function, called once."""
    keras_lane.prepare("float32", 42, keras)
    with strategy.scope():
        state = TrainingState.create(lambda: models.cnn([28, 28, 1], 10), lambda _: optimizers.adam(0.001))
    steps = ReplicaSteps(strategy, state, BATCH, losses.sparse_categorical_crossentropy)
    variables = state.model.trainable_variables
    zeros = [tf.zeros_like(variable) for variable in variables]
    whole = tf.function(steps.distributed_train_step)
    forward = tf.function(lambda: state.model(images, training=True))
    forward_backward = tf.function(lambda: steps.forward_backward(images, labels)[:2])
    update = tf.function(lambda: state.optimizer.apply_gradients(zip(zeros, variables, strict=True)))
    logits = forward()
    loss = tf.function(lambda: losses.sparse_categorical_crossentropy(labels, logits))
    calls = dict(zip(PARTS, (lambda: whole((images, labels)), forward, forward_backward, update, loss), strict=True))
    for call in calls.values():
        call()  # traced before it is timed
    return calls


def measure(calls: int, repeats: int) -> list[tuple[str, float, float]]:
    rng = np.random.default_rng(0)
    images = tf.constant(rng.random((BATCH, 28, 28, 1), dtype=np.float32))
    labels = tf.constant(rng.integers(0, 10, BATCH))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    lanes = {keras: lane_calls(keras, strategy, images, labels) for keras in keras_lane.KERAS_VERSIONS}
    keras_lane.select(2)
    variants = {(keras, part): call for keras, parts in lanes.items() for part, call in parts.items()}
    timings = interleaved_us(
        {f"{keras} {part}": call for (keras, part), call in variants.items()}, calls, repeats, lambda: None
    )
    return [(part, timings[f"2 {part}"], timings[f"3 {part}"]) for part in PARTS]


def markdown_table(rows: list[tuple[str, float, float]]) -> str:
    lines = [
        "| part of the step | tf_keras (us) | Keras 3 (us) | Keras 3 speed / tf_keras |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| {part} | {ours:.0f} | {theirs:.0f} | {ours / theirs:.2f} |" for part, ours, theirs in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.keras3_step", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30, help="calls per timing")
    parser.add_argument("--repeats", type=int, default=12, help="rounds; the medians are reported")
    args = parser.parse_args(argv)
    print(markdown_table(measure(args.calls, args.repeats)))


if __name__ == "__main__":
    main()

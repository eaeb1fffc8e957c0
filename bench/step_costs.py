"""What the runner's loops do on the host per step besides the step itself, each part timed alone.

`python -m bench.step_costs` builds the benchmark's workload in one process (the CNN, OneDeviceStrategy,
batch 64, the runner's in-memory pipeline over random inputs of Fashion-MNIST's shape) and times, in
microseconds per call, the step function and each piece of host work the loops add around it: the
distributed iterator's `next()`, an eager `total += loss`, the progress display (bar off and on), the
preemption guard's check, the whole step boundary, and building an epoch's dataset. Medians of `--repeats`
timings of `--calls` calls each.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from collections.abc import Callable

from runner.entry import prepare_for_tensorflow

prepare_for_tensorflow()

import numpy as np  # noqa: E402 (after TensorFlow's environment is set)
import tensorflow as tf  # noqa: E402

from bench.reference import create_model  # noqa: E402
from runner.clusters.preemption import PreemptionGuard  # noqa: E402
from runner.data.in_memory import InMemoryData  # noqa: E402
from runner.data.source import DataSpec  # noqa: E402
from runner.training.controller import _StepBoundaries  # noqa: E402
from runner.training.loop import LossSum, iterator_step  # noqa: E402
from runner.training.progress import EpochProgress  # noqa: E402
from runner.training.steps import ReplicaSteps, TrainingState  # noqa: E402

BATCH = 64


def per_call_us(
    call: Callable[[], object], calls: int, repeats: int, sync: Callable[[], object] = lambda: None
) -> float:
    """Median over `repeats` of the microseconds per call of `calls` calls (`sync` waits for the device)."""
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
        timings.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(timings)


def interleaved_us(
    variants: dict[str, Callable[[], object]], calls: int, repeats: int, sync: Callable[[], object]
) -> dict[str, float]:
    """per_call_us of each variant, round after round, each round starting one variant later: the machine's
    drift and other processes' load hit every variant alike."""
    names, timings = list(variants), {name: [] for name in variants}
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            timings[name].append(per_call_us(variants[name], calls, 1, sync))
    return {name: statistics.median(values) for name, values in timings.items()}


def measure(examples: int, calls: int, repeats: int) -> list[tuple[str, float]]:
    rng = np.random.default_rng(0)
    spec = DataSpec("random", (28, 28, 1), 10, (28, 28), "uint8", 255.0)
    data = InMemoryData(
        spec,
        rng.random((examples, 28, 28, 1), dtype=np.float32),
        rng.integers(0, 10, examples),
        rng.random((256, 28, 28, 1), dtype=np.float32),
        rng.integers(0, 10, 256),
    )
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")

    def built_model():
        model = create_model()
        model.build((None, 28, 28, 1))
        return model

    with strategy.scope():
        state = TrainingState.create(built_model, lambda variables: tf.keras.optimizers.Adam())
        state.optimizer.build(state.model.trainable_variables)
    loss_function = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )
    steps = ReplicaSteps(strategy, state, BATCH, loss_function)

    def make_dataset(**epochs):
        return strategy.experimental_distribute_dataset(data.train_dataset(BATCH, 42, **epochs))

    iterator = iter(make_dataset(first_epoch=1, epochs=None))
    inputs = next(iterator)
    plain_step = tf.function(steps.distributed_train_step)
    loss_sum = LossSum()
    step = iterator_step(steps, loss_sum)
    loss = plain_step(inputs)
    step(iterator)
    total = tf.constant(0.0)

    def add() -> None:
        nonlocal total
        total += loss

    quiet, drawn = EpochProgress(1, enabled=False), EpochProgress(1, enabled=True)
    for progress in (quiet, drawn):
        progress._first_step_done = True  # noqa: SLF001 (its one-off line is not a per-step cost)
    drawn.start_epoch(1, calls * repeats * 10)
    drawn._bar.fp = io.StringIO()  # noqa: SLF001 (drawn, as on a terminal, into memory)
    drawn._bar.disable = False  # noqa: SLF001
    guard = PreemptionGuard()
    boundaries = _StepBoundaries(quiet, guard)

    @tf.function
    def fit_style_step(iterator):  # what model.fit's train function does: next() inside the graph
        return steps.distributed_train_step(next(iterator))

    def before() -> None:  # what the for_in and iterator loops did per step
        nonlocal total
        total += plain_step(next(iterator))

    def sync() -> float:
        return float(state.optimizer.iterations)

    fit_style_step(iterator)
    whole_steps = interleaved_us(
        {
            "a step as the loops ran it: step(next(iterator)), then an eager `total += loss`": before,
            "a step as they run it now: step(iterator), the batch drawn and the loss summed inside": lambda: step(
                iterator
            ),
            "a step as model.fit runs it: next(iterator) inside the train function": lambda: fit_style_step(iterator),
            "the step alone, on one batch already drawn": lambda: plain_step(inputs),
        },
        calls,
        repeats,
        sync,
    )

    def copied_dataset():
        data.__dict__.pop("_train_tensors", None)  # forget the tensors made once: copy the arrays again
        return iter(make_dataset(first_epoch=2, epochs=1))

    rows = [
        *whole_steps.items(),
        (
            "eager `total += loss` (what the loops did per step)",
            per_call_us(add, calls * 10, repeats, lambda: float(total)),
        ),
        ("progress.advance, bar off (piped output)", per_call_us(lambda: quiet.advance(1, loss), calls * 10, repeats)),
        ("progress.advance, bar on (a terminal)", per_call_us(lambda: drawn.advance(1, loss), calls * 10, repeats)),
        ("preemption guard's check", per_call_us(guard.at_step_boundary, calls * 10, repeats)),
        (
            "the whole step boundary (progress off + guard)",
            per_call_us(lambda: boundaries.advance(1, loss, total), calls * 10, repeats),
        ),
        (
            "a for_in epoch's dataset and iterator (once per epoch)",
            per_call_us(lambda: iter(make_dataset(first_epoch=2, epochs=1)), 3, repeats),
        ),
        (
            "... as before: the training set copied into a new constant every epoch",
            per_call_us(copied_dataset, 3, repeats),
        ),
    ]
    drawn._bar.close()  # noqa: SLF001
    return rows


def markdown_table(rows: list[tuple[str, float]]) -> str:
    lines = ["| per-step work | us per call |", "| --- | ---: |"]
    lines += [f"| {name} | {us:.1f} |" for name, us in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.step_costs", description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=12000, help="training examples held in memory")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(markdown_table(measure(args.examples, args.calls, args.repeats)))


if __name__ == "__main__":
    main()

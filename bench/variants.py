"""What is benchmarked: the reference script (its loop, or tf_keras `model.fit`) or the runner with some
overrides, for a number of replicas.

A variant knows its command line, its extra environment, and how to read back its per-epoch training
examples/second: the reference prints them (`BENCH {...}` lines), the runner logs them to MLflow as
`examples_per_second`. Both use the same strategy for a number of replicas: OneDeviceStrategy for one,
MirroredStrategy over that many logical CPUs for more.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench.measure import Finished
from bench.records import FileData, parse_data

REFERENCE_SCRIPT = Path(__file__).with_name("reference.py")
REFERENCE_MARKER = '"event": "first_step"'
RUNNER_MARKER = "first training step done"  # runner.training.progress.FIRST_STEP_MESSAGE, without importing TensorFlow
REFERENCE = "reference"  # the variant every ratio is taken against
# `fit`, `fit20`, `fit20+heap`: the reference script's model.fit, with that many steps per execution (1 if none).
_FIT = re.compile(r"^fit(\d*)(\+.*)?$")


def is_script(name: str) -> bool:
    """A variant of the reference script (its loop, or model.fit), not of the runner."""
    return name.startswith(REFERENCE) or _FIT.match(name) is not None


def fit_steps_per_execution(name: str) -> int | None:
    """`model.fit`'s steps_per_execution for a `fit` variant's name; None for any other variant."""
    match = _FIT.match(name)
    return None if match is None else int(match.group(1) or 1)


_ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")  # Hydra keys here are lower case


@dataclass(frozen=True)
class Workload:
    """The same work for every variant: the data, its size, the epochs and the per-replica batch."""

    data_dir: str | None  # None: synthetic data
    train_examples: int
    epochs: int
    batch: int = 64


def strategy_overrides(replicas: int) -> list[str]:
    if replicas == 1:
        return ["strategy=one_device"]
    return ["strategy=mirrored", f"strategy.cpu_replicas={replicas}"]


@dataclass(frozen=True)
class Variant:
    name: str
    replicas: int
    overrides: tuple[str, ...] = field(default=())  # the runner's; empty for the reference script
    env: tuple[str, ...] = field(default=())  # NAME=value, added to the environment
    data: FileData | None = None  # the workload written as files (bench.records); None: the built-in data in memory

    @property
    def is_reference(self) -> bool:
        """The reference script (the variant named `reference`, or a variant of it such as `reference+heap`),
        training with its loop or (`fit`, `fit20`) with model.fit."""
        return is_script(self.name)

    @property
    def marker(self) -> str:
        return REFERENCE_MARKER if self.is_reference else RUNNER_MARKER

    def command(self, work: Workload, run_dir: str, tracking_uri: str) -> list[str]:
        if self.is_reference:
            strategy = "one_device" if self.replicas == 1 else "mirrored"
            command = [
                sys.executable,
                str(REFERENCE_SCRIPT),
                f"--replicas={self.replicas}",
                f"--strategy={strategy}",
                f"--batch={work.batch}",
                f"--epochs={work.epochs}",
                f"--train-examples={work.train_examples}",
            ]
            steps_per_execution = fit_steps_per_execution(self.name)
            if steps_per_execution is not None:
                command += ["--fit", f"--steps-per-execution={steps_per_execution}"]
            return command + ([f"--data-dir={work.data_dir}"] if work.data_dir else [])
        if self.data is not None:  # files holding exactly the examples to train on
            dataset = self.data.overrides(os.path.dirname(run_dir))
        else:
            dataset = (
                [f"dataset.dir={work.data_dir}"]
                if work.data_dir
                else ["dataset=synthetic", "dataset.test_examples=10000"]
            )
            dataset.append(f"dataset.train_examples={work.train_examples}")
        return [
            sys.executable,
            "-m",
            "runner",
            *strategy_overrides(self.replicas),
            *dataset,
            f"epochs={work.epochs}",
            f"batch={work.batch}",
            *self.overrides,
            f"hydra.run.dir={run_dir}",
            f"mlflow.tracking_uri={tracking_uri}",
            "mlflow.experiment_name=bench",
        ]

    def examples_per_second(self, finished: Finished, run_dir: str, tracking_uri: str) -> list[float]:
        """Training examples/second of each epoch, in epoch order."""
        if self.is_reference:
            events = [
                json.loads(line.split("BENCH ", 1)[1])
                for line in finished.output.splitlines()
                if line.startswith("BENCH ")
            ]
            return [event["examples_per_second"] for event in events if event["event"] == "epoch"]
        from mlflow.tracking import MlflowClient

        with open(os.path.join(run_dir, "mlflow_run_id.txt")) as handle:
            run_id = handle.read().strip()
        history = MlflowClient(tracking_uri).get_metric_history(run_id, "examples_per_second")
        return [metric.value for metric in sorted(history, key=lambda metric: metric.step)]


# Variants known by name alone, besides the loop styles: what determinism costs, with the default loop and
# with the fastest one.
NAMED = {
    "deterministic": ("runtime.deterministic=true",),
    "multi_step+deterministic": ("loop=multi_step", "runtime.deterministic=true"),
    # The Keras 3 lane: the built-in CNN built with `import keras` (against `for_in`, its tf_keras twin).
    "keras3": ("loop=for_in", "runtime.keras=3"),
}


def parse_variant(spec: str, replicas: int) -> Variant:
    """`name` (a loop style, one of NAMED, `reference`, or `fit`/`fitN`: model.fit with N steps per execution) or
    `name=item item ...`, each item a runner override, an environment variable (`NAME=value`, upper case) or the
    files to read the workload from (`data:tfrecord`, `data:npz*10`: bench.records). A name starting with
    `reference`, or `fitN+...`, runs the reference script."""
    name, _, rest = spec.partition("=")
    if not rest and name in NAMED:
        return Variant(name, replicas, NAMED[name])
    items = rest.split()
    data = [parse_data(item) for item in items if item.startswith("data:")]
    items = [item for item in items if not item.startswith("data:")]
    env = tuple(item for item in items if _ENV_ASSIGNMENT.match(item))
    overrides = tuple(item for item in items if item not in env)
    if is_script(name):
        if overrides:
            raise ValueError(f"{spec!r}: the reference script takes no runner overrides")
        return Variant(name, replicas, (), env)
    return Variant(name, replicas, overrides if items else (f"loop={name}",), env, data[0] if data else None)

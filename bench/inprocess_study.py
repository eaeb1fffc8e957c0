"""The in-process baseline of bench.sweep_cost: the runner's Optuna sweep (same search space, sampler and seed, same
data and validation split, the tutorial's CNN) as one Python process that fits each trial with model.fit and logs it
as a nested MLflow run. It prints one JSON line at the end: the trials, the best val_accuracy, the seconds of each
trial's objective call.

    python -m bench.inprocess_study --trials 6 --data-dir ../shared/data/fashion-mnist \
        --train-examples 3000 --test-examples 1000 --tracking-uri sqlite:////tmp/study/mlflow.db
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data" / "fashion-mnist"
SEED = 42
VALIDATION_FRACTION = 0.1  # what a runner sweep's job holds out (runner.config.schema.SWEEP_VALIDATION_FRACTION)
SCALE = 255.0  # dataset.scale: raw pixels to [0, 1]
EXPERIMENT = "fashion_mnist"


class Splits(NamedTuple):
    """Inputs as float32 in [0, 1] with a channel axis, labels as int64."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.inprocess_study", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--data-dir", default=str(SHARED_DATA), help="the four Fashion-MNIST IDX files")
    parser.add_argument("--train-examples", type=int, default=3000)
    parser.add_argument("--test-examples", type=int, default=1000)
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    return parser.parse_args(argv)


def to_model_input(raw: np.ndarray) -> np.ndarray:
    """As the runner feeds images (runner.data.in_memory.to_model_input): float32 / 255, a channel axis."""
    return (raw.astype(np.float32) / np.float32(SCALE)).reshape((-1, *raw.shape[1:], 1))


def load(data_dir: str, train_examples: int, test_examples: int) -> Splits:
    """The first `train_examples` training and `test_examples` test images, and the runner's validation split:
    VALIDATION_FRACTION of the training examples, stratified by label, drawn from SEED."""
    from runner.data.idx import load_idx_directory
    from runner.data.validation import split_examples

    train_x, train_y, test_x, test_y = load_idx_directory(data_dir)
    train_x, train_y = train_x[:train_examples], train_y[:train_examples].astype(np.int64)
    test_x, test_y = test_x[:test_examples], test_y[:test_examples].astype(np.int64)
    training, validation = split_examples(train_y, VALIDATION_FRACTION, SEED, EXPERIMENT)
    return Splits(
        to_model_input(train_x[training]),
        train_y[training],
        to_model_input(train_x[validation]),
        train_y[validation],
        to_model_input(test_x),
        test_y,
    )


def fit_and_score(tf: Any, data: Splits, lr: float, batch: int) -> dict[str, float]:
    """One trial's training: the tutorial's CNN, one epoch of model.fit, then the test set; its metrics."""
    from runner.builtins.models import cnn

    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(SEED)
    model = cnn(input_shape=data.x_train.shape[1:], num_classes=10)
    model.compile(
        optimizer=tf.keras.optimizers.Adam(lr),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = model.fit(
        data.x_train, data.y_train, batch_size=batch, epochs=1, validation_data=(data.x_val, data.y_val), verbose=0
    ).history
    test_loss, test_accuracy = model.evaluate(data.x_test, data.y_test, verbose=0)
    return {
        "train_loss": history["loss"][-1],
        "train_accuracy": history["accuracy"][-1],
        "val_loss": history["val_loss"][-1],
        "val_accuracy": history["val_accuracy"][-1],
        "test_loss": test_loss,
        "test_accuracy": test_accuracy,
    }


def objective(tf: Any, mlflow: Any, data: Splits, seconds: list[float]) -> Callable[[Any], float]:
    """The study's objective: a trial's val_accuracy, its run nested under the active parent run; the seconds of
    each call are appended to `seconds`."""

    def trial_objective(trial: Any) -> float:
        started = time.perf_counter()
        lr = trial.suggest_float("optimizer.lr", 1e-4, 1e-2, log=True)
        batch = trial.suggest_categorical("batch", [32, 64, 128])
        metrics = fit_and_score(tf, data, lr, batch)
        with mlflow.start_run(nested=True, run_name=f"trial {trial.number}"):
            mlflow.log_params({"optimizer.lr": lr, "batch": batch})
            mlflow.log_metrics({name: float(value) for name, value in metrics.items()})
        seconds.append(time.perf_counter() - started)
        return float(metrics["val_accuracy"])

    return trial_objective


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is tf_keras (Keras 2), as in the runner
    import mlflow
    import optuna
    import tensorflow as tf
    import tf_keras  # type: ignore[import-untyped]  # noqa: F401  (tf.keras under TF_USE_LEGACY_KERAS=1)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    data = load(args.data_dir, args.train_examples, args.test_examples)
    mlflow.set_tracking_uri(args.tracking_uri)
    mlflow.set_experiment(EXPERIMENT)
    seconds: list[float] = []
    with mlflow.start_run(run_name="in-process study"):
        study = optuna.create_study(
            direction="maximize", sampler=optuna.samplers.TPESampler(seed=SEED, n_startup_trials=5)
        )
        study.optimize(objective(tf, mlflow, data, seconds), n_trials=args.trials)
        mlflow.log_metric("best_val_accuracy", study.best_value)
    print(json.dumps({"trials": len(study.trials), "best_value": study.best_value, "trial_seconds": seconds}))


if __name__ == "__main__":
    main()

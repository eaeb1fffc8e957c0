"""Early stopping and the best epoch's weights (runner.training.early_stopping), trained in this process on data a
small CNN overfits: synthetic images whose training labels are 40% wrong. The run stops `patience` epochs after its
best val_loss, ends FINISHED with the tags `best_epoch` and `stopped_at_epoch`, and its evaluation at the end is the
best epoch's model (checkpoint.keep_best) or the last epoch's (keep_best=false); the state is kept with each
checkpoint, and a run restored after its stop trains no further epoch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from helpers.presets import WITH_MODEL
from helpers.tracking import metric_history, mlflow_client
from runner.config.schema import CheckpointSettings, EarlyStoppingSettings
from runner.data.builtin import synthetic
from runner.data.source import DataSplits
from runner.training.early_stopping import EarlyStopping, watch_of

OVERFITTING = (
    f"dataset._target_={__name__}.noisy_labels",
    "dataset.validation_fraction=0.25",
    "epochs=30",
    "optimizer.lr=0.01",
    "strategy=one_device",
)


def noisy_labels(train_examples: int = 2048, test_examples: int = 256, wrong: float = 0.4, seed: int = 0):
    """synthetic's images and labels, `wrong` of the training labels replaced by random ones (the test set's are
    right): learning the images helps the held-out loss, memorizing the wrong labels then hurts it."""
    splits = synthetic(train_examples, test_examples, seed=seed)
    images, labels = splits.train
    rng = np.random.default_rng(seed + 1)
    replaced = rng.random(len(labels)) < wrong
    labels = labels.copy()
    labels[replaced] = rng.integers(0, 10, size=int(replaced.sum()))
    return DataSplits((images, labels), splits.test, num_classes=10)


def _history(client, run_id: str, metric: str, last_epoch: int | None = None) -> list[float]:
    """The metric's values per epoch (up to `last_epoch`: not the best epoch's logged again after it)."""
    return [value for step, value in metric_history(client, run_id, metric) if last_epoch is None or step <= last_epoch]


@pytest.mark.slow  # about 15 s of training
def test_a_run_that_overfits_stops_patience_epochs_after_its_best_and_evaluates_that_epochs_weights(
    train, tmp_path, tracking_uri
):
    every_checkpoint = ("mlflow.log_every_checkpoint=true", "checkpoint.every_epochs=3")
    result = train(*OVERFITTING, "early_stopping.patience=3", WITH_MODEL, *every_checkpoint)
    client = mlflow_client(tracking_uri)
    run = client.get_run(result.run_id)
    stopped = int(run.data.tags["stopped_at_epoch"])
    val_loss = _history(client, result.run_id, "val_loss", last_epoch=stopped)
    best = int(np.argmin(val_loss)) + 1
    assert len(val_loss) == best + 3 == stopped < 30  # stopped 3 epochs after its lowest val_loss, before its last
    assert run.info.status == "FINISHED"
    assert run.data.tags["best_epoch"] == str(best)
    # The restored model is the best epoch's (keep_best, on with early stopping): its test accuracy, not the last's.
    test_accuracy = _history(client, result.run_id, "test_accuracy", last_epoch=stopped)
    assert run.data.metrics["eval_accuracy"] == pytest.approx(test_accuracy[best - 1], abs=1e-6)
    assert test_accuracy[best - 1] != test_accuracy[-1]  # the data makes the two differ, so the check can fail
    # That epoch's metrics are logged again one step after the last (as mlflow.tensorflow.autolog does): the run's
    # latest values, what mlflow ui lists, the result (a sweep's objective) and the summary compare, are its model's.
    assert run.data.tags["best_metrics_step"] == str(stopped + 1)
    assert metric_history(client, result.run_id, "val_loss")[-1] == (stopped + 1, pytest.approx(val_loss[best - 1]))
    assert run.data.metrics["test_accuracy"] == pytest.approx(test_accuracy[best - 1])
    assert result.final_metrics["val_loss"] == pytest.approx(val_loss[best - 1])
    # The logged model is that epoch's: a LoggedModel at its step, linked to its metrics and eval_accuracy.
    [model] = client.search_logged_models(experiment_ids=[run.info.experiment_id], filter_string="name = 'model'")
    linked = {metric.key: (metric.step, metric.value) for metric in model.metrics}
    assert linked["val_loss"] == (best, pytest.approx(val_loss[best - 1]))
    assert linked["eval_accuracy"] == (best, pytest.approx(run.data.metrics["eval_accuracy"]))
    # mlflow.log_every_checkpoint: each epoch's checkpoint (every 3rd, and the one the stop saved) is a LoggedModel at
    # its epoch's step, linked to that epoch's metrics, and search_logged_models ranks them by any of those.
    epochs = sorted({*range(3, stopped + 1, 3), stopped})
    ranked = client.search_logged_models(
        experiment_ids=[run.info.experiment_id],
        filter_string="name != 'model'",
        order_by=[{"field_name": "metrics.val_loss", "ascending": True}],
    )
    assert [each.name for each in ranked] == [
        f"checkpoint-{epoch}" for epoch in sorted(epochs, key=lambda e: val_loss[e - 1])
    ]
    for each in ranked:
        epoch = int(each.name.removeprefix("checkpoint-"))
        linked = {metric.key: (metric.step, metric.value) for metric in each.metrics}
        assert linked["val_loss"] == (epoch, pytest.approx(val_loss[epoch - 1]))
        assert each.source_run_id == result.run_id

    # Restored in the state it stopped in (the checkpoint after its last epoch holds it), the run trains no more.
    again = train(*OVERFITTING, "early_stopping.patience=3", WITH_MODEL, *every_checkpoint, run_dir=tmp_path / "run")
    assert again.history == [] and again.run_id == result.run_id
    assert len(_history(client, result.run_id, "val_loss", last_epoch=stopped)) == best + 3
    assert again.final_metrics["val_loss"] == pytest.approx(val_loss[best - 1])


@pytest.mark.slow  # about 15 s of training
def test_without_keep_best_the_last_epoch_is_evaluated_and_a_higher_is_better_monitor_stops_on_no_rise(
    train, tracking_uri
):
    result = train(
        *OVERFITTING,
        "early_stopping.patience=2",
        "early_stopping.monitor=val_accuracy",
        "early_stopping.min_delta=0.01",
        "checkpoint.keep_best=false",
    )
    client = mlflow_client(tracking_uri)
    run = client.get_run(result.run_id)
    val_accuracy = _history(client, result.run_id, "val_accuracy")
    # The epoch that last raised the best val_accuracy by more than 0.01, then two epochs without such a rise.
    best, best_epoch = -math.inf, 0
    for epoch, value in enumerate(val_accuracy, start=1):
        if value > best + 0.01:
            best, best_epoch = value, epoch
    assert len(val_accuracy) == best_epoch + 2 < 30
    assert run.data.tags["best_epoch"] == str(best_epoch) and "best_metrics_step" not in run.data.tags
    test_accuracy = _history(client, result.run_id, "test_accuracy")
    assert run.data.metrics["eval_accuracy"] == pytest.approx(test_accuracy[-1], abs=1e-6)


def test_the_state_and_the_best_weights_are_kept_with_a_checkpoint(tmp_path):
    """What a resumed run continues from: the best value, its epoch, the epochs without improvement and the best
    epoch's weights come back from the checkpoint, and the restored state goes on as the saved one would."""
    watch = watch_of(
        EarlyStoppingSettings(patience=2), CheckpointSettings(), objective=None, has_validation=True
    )  # val_loss, lower is better, keep_best
    assert watch is not None and watch.monitor == "val_loss" and watch.lower_is_better and watch.keep_best

    def model():
        tf.keras.utils.set_random_seed(1)
        return tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])

    trained = model()
    saved = EarlyStopping(watch, trained)
    assert not saved.after_epoch(1, {"val_loss": 0.9})
    best_weights = [weight.numpy().copy() for weight in trained.weights]
    trained.layers[0].kernel.assign_add(tf.ones_like(trained.layers[0].kernel))  # epoch 2 moves the weights
    assert not saved.after_epoch(2, {"val_loss": 0.95})
    path = tf.train.Checkpoint(early_stopping=saved).save(str(tmp_path / "ckpt"))

    fresh = model()
    restored = EarlyStopping(watch, fresh)
    tf.train.Checkpoint(early_stopping=restored).restore(path).assert_existing_objects_matched()
    assert (float(restored.best.numpy()), int(restored.best_epoch.numpy()), int(restored.waited.numpy())) == (
        0.9,
        1,
        1,
    )
    evaluated = model()
    evaluated.layers[0].kernel.assign(tf.zeros_like(evaluated.layers[0].kernel))
    assert restored.restore_best_into(evaluated) == 1
    for weight, best in zip(evaluated.weights, best_weights, strict=True):
        np.testing.assert_array_equal(weight.numpy(), best)
    assert restored.after_epoch(3, {"val_loss": 0.92})  # the second epoch without improvement: stop
    assert restored.stopped and restored.tags(3) == {"best_epoch": "1", "stopped_at_epoch": "3"}


def test_no_early_stopping_and_no_keep_best_watch_nothing():
    assert watch_of(EarlyStoppingSettings(), CheckpointSettings(), objective=None, has_validation=False) is None
    kept = watch_of(EarlyStoppingSettings(), CheckpointSettings(keep_best=True), "val_accuracy", has_validation=True)
    assert kept is not None and kept.patience is None and kept.monitor == "val_accuracy" and not kept.lower_is_better

"""What the controller does once the last epoch is trained (Orbit's actions): each a callable on the run's
history, run in order, none of them special-casing a model or a dataset."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from runner.metric_table import MODEL_BYTES
from runner.outcome import BEST_METRICS_STEP_TAG
from runner.plots import plot_curves
from runner.tracking.artifacts import MODEL_NAME
from runner.tracking.protocol import Tracker
from runner.training.checkpoints import Checkpointer, evaluate_scores, restore_without_strategy
from runner.training.controller import EpochResult
from runner.training.early_stopping import EarlyStopping

if TYPE_CHECKING:
    from runner.tracking.model_export import ExportedModel

log = logging.getLogger("runner")


class RestoreAndEvaluate:
    """The tutorial's last step: the newest checkpoint restored into a fresh model without any strategy, and its
    scores on the test set logged as `eval_<name>` (`eval_accuracy`; `build_scores`: new Keras metrics by name).
    With checkpoint.keep_best (`early_stopping`), the weights are the best epoch's, kept in that checkpoint
    (runner.training.early_stopping)."""

    def __init__(
        self,
        checkpointer: Checkpointer,
        build_model: Callable[[], tf.keras.Model],
        test_batches: tf.data.Dataset,
        tracker: Tracker,
        last_epoch: tf.Variable,
        build_scores: Callable[[], dict[str, Any]],
        early_stopping: EarlyStopping | None = None,
        scored: Callable[[Any], Any] | None = None,
        continued: bool = False,
    ):
        self.checkpointer = checkpointer
        # A run continued after an invocation that had trained every epoch (its model logged late, a sweep's
        # champion): what that invocation logged is not logged again.
        self.continued = continued
        self.last_epoch = last_epoch  # the training state's epoch counter
        self.early_stopping = early_stopping
        self.build_model = build_model
        self.test_batches = test_batches
        self.tracker = tracker
        self.build_scores = build_scores
        self.scored = scored  # what the scores are updated with (the task's: runner.training.task.Experiment.scored)
        self.model: tf.keras.Model | None = None
        self.scores: dict[str, float] = {}  # eval_<name>, once restored and evaluated
        self.epoch = 0  # the epoch whose weights the model holds, once restored: the step of the eval_* metrics

    def __call__(self, history: list[EpochResult]) -> None:
        latest = self.checkpointer.latest
        assert latest is not None, "the last epoch's checkpoint is saved (or restored) before the end actions run"
        self.model = restore_without_strategy(latest, self.build_model)
        best = self.early_stopping.restore_best_into(self.model) if self.early_stopping is not None else None
        self.epoch = best if best is not None else int(self.last_epoch.numpy())
        scores = evaluate_scores(self.model, self.test_batches, self.build_scores(), self.scored)
        self.scores = {f"eval_{name}": value for name, value in scores.items()}
        self.tracker.log_metrics(unlogged(self.tracker, self.scores, self.epoch, self.continued), step=self.epoch)
        weights = f" with the weights of its best epoch, {best} (checkpoint.keep_best)" if best is not None else ""
        said = ", ".join(f"{key} {value:.4f}" for key, value in self.scores.items()) or "no score (metrics is empty)"
        log.info("restored %s without a strategy%s: %s", latest, weights, said)


def unlogged(tracker: Tracker, metrics: dict[str, float], step: int, continued: bool) -> dict[str, float]:
    """`metrics` less those the run already holds at `step`, where it is `continued` (else all of them)."""
    if not continued:
        return metrics
    histories = tracker.metric_histories()
    return {key: value for key, value in metrics.items() if step not in {at for at, _ in histories.get(key, ())}}


class TagEarlyStopping:
    """With early stopping: the run's tags `best_epoch` and, if it stopped before its last epoch, `stopped_at_epoch`
    (runner.training.early_stopping)."""

    def __init__(self, early_stopping: EarlyStopping, epoch: tf.Variable, tracker: Tracker):
        self.early_stopping = early_stopping
        self.epoch = epoch
        self.tracker = tracker

    def __call__(self, history: list[EpochResult]) -> None:
        self.tracker.set_tags(self.early_stopping.tags(int(self.epoch.numpy())))


class LogBestEpochMetrics:
    """With checkpoint.keep_best, when the best epoch came before the last: that epoch's metrics logged again one step
    after the last epoch, as `mlflow.tensorflow.autolog` does for Keras' `restore_best_weights`. A run's latest value
    of each metric (the column `mlflow ui` shows, what a sweep compares on its objective, what the summary lists
    and the registration compares) is then that of the model it hands over."""

    def __init__(
        self, restored: RestoreAndEvaluate, last_epoch: tf.Variable, tracker: Tracker, epoch_keys: tuple[str, ...]
    ):
        self.restored = restored
        self.last_epoch = last_epoch  # the training state's epoch counter
        self.tracker = tracker
        self.epoch_keys = epoch_keys  # the run's per-epoch model metrics (runner.metric_table)

    def __call__(self, history: list[EpochResult]) -> None:
        model_epoch, last = self.restored.epoch, int(self.last_epoch.numpy())
        if model_epoch in (0, last):
            return
        best = {
            key: value
            for key, points in self.tracker.metric_histories().items()
            if key in self.epoch_keys
            for step, value in points
            if step == model_epoch
        }
        self.tracker.log_metrics(unlogged(self.tracker, best, last + 1, self.restored.continued), step=last + 1)
        self.tracker.set_tags({BEST_METRICS_STEP_TAG: str(last + 1)})  # what a sweep's curves leave out
        log.info("the metrics of epoch %d, the model handed over, logged again at step %d", model_epoch, last + 1)


class PlotCurves:
    """curves.png: the run's per-epoch metrics, whichever invocation logged them, in the run directory and MLflow."""

    def __init__(
        self,
        tracker: Tracker,
        path: str,
        title: str,
        last_epoch: tf.Variable,
        metrics: tuple[str, ...] = ("loss", "accuracy"),
    ):
        self.tracker = tracker
        self.path = path
        self.title = title
        self.last_epoch = last_epoch  # the training state's epoch counter
        self.metrics = metrics  # a panel each: the loss, then the scores (runner.metric_table)

    def __call__(self, history: list[EpochResult]) -> None:
        # Epochs only: not the best epoch's metrics logged again after the last (LogBestEpochMetrics).
        last = int(self.last_epoch.numpy())
        epochs = {
            key: [(step, value) for step, value in points if step <= last]
            for key, points in self.tracker.metric_histories().items()
        }
        self.tracker.log_artifact(plot_curves(epochs, self.path, title=self.title, metrics=self.metrics))


@dataclass(frozen=True)
class ModelLogging:
    """How the run's models are logged: the task's raw-input export of a trained network, a few raw examples, and
    the run they belong to."""

    export: Callable[[tf.keras.Model], tf.keras.Model]
    raw_examples: Any
    tracking_uri: str
    run_id: str

    def log(self, network: tf.keras.Model, step: int, name: str = MODEL_NAME) -> ExportedModel:
        """`network` behind the export as the run's LoggedModel `name`, at `step` and linked to its metrics there."""
        # Only now (after training, or with mlflow.log_every_checkpoint): it imports MLflow's TensorFlow flavor.
        from runner.tracking.model_export import log_run_model  # noqa: PLC0415  MLflow: see above

        return log_run_model(
            network, self.export(network), self.tracking_uri, self.run_id, step, self.raw_examples, name
        )


class LogModel:
    """The restored model behind the task's raw-input export, as the run's MLflow Model; its files' size logged as
    `model_bytes` (runner.metric_table.COST) beside how long logging it took."""

    def __init__(self, restored: RestoreAndEvaluate, model_logging: ModelLogging, tracker: Tracker):
        self.restored = restored
        self.model_logging = model_logging
        self.tracker = tracker
        self.logged: ExportedModel | None = None  # once logged

    def __call__(self, history: list[EpochResult]) -> None:
        from runner.tracking.model_export import LOG_SECONDS  # noqa: PLC0415  MLflow: after training

        # Its step is its weights' epoch (the best one with checkpoint.keep_best): the LoggedModel is linked to that
        # epoch's metrics and to eval_accuracy, which the restore logged at that step.
        step = self.restored.epoch
        self.logged = logged = self.model_logging.log(self.restored.model, step)
        if logged.logged:
            self.tracker.log_metrics({LOG_SECONDS: logged.seconds, MODEL_BYTES: float(logged.bytes)}, step=step)


class LogCheckpointModels:
    """mlflow.log_every_checkpoint: a controller listener that logs each epoch's checkpoint, restored without a
    strategy as the run's model is, as the LoggedModel `checkpoint-<epoch>` at that epoch's step, linked to the
    epoch's metrics (handed to the tracker just before, and delivered before the export: the tracker listens first).
    A preemption's save mid-epoch holds weights of no epoch and logs nothing: a checkpoint is an epoch's when no step
    has run since that epoch ended. A tracking server that does not answer gets no checkpoint model (training does
    not wait for it)."""

    def __init__(
        self,
        tracker: Tracker,
        checkpointer: Checkpointer,
        build_model: Callable[[], tf.keras.Model],
        steps: tf.Variable,
        model_logging: ModelLogging,
    ):
        self.tracker = tracker
        self.checkpointer = checkpointer
        self.build_model = build_model
        self.steps = steps  # the optimizer's step counter
        self.model_logging = model_logging
        self._epoch_end: tuple[int, int] | None = None  # the last epoch that ended, and the steps it ended at

    def on_epoch_end(self, result: EpochResult) -> None:
        self._epoch_end = (result.epoch, int(self.steps.numpy()))

    def on_checkpoint_saved(self, epoch: int, files: list[str]) -> None:
        if self._epoch_end != (epoch, int(self.steps.numpy())) or self.checkpointer.latest is None:
            return
        from runner.tracking.model_export import answers  # noqa: PLC0415  MLflow: only with log_every_checkpoint

        if not answers(self.model_logging.tracking_uri):
            log.warning(
                "the MLflow tracking server does not answer: epoch %d's checkpoint is not logged as a model", epoch
            )
            return
        self.tracker.metric_histories()  # answered once the tracker has delivered the epoch's metrics, to link them
        network = restore_without_strategy(self.checkpointer.latest, self.build_model)
        self.model_logging.log(network, epoch, checkpoint_model_name(epoch))


def checkpoint_model_name(epoch: int) -> str:
    """The LoggedModel name of an epoch's checkpoint (mlflow.log_every_checkpoint)."""
    return f"checkpoint-{epoch}"


class RegisterModel:
    """mlflow.register=true: the run's model as a new version of the registered model, compared on the objective."""

    def __init__(
        self, name: str, objective: str, lower_is_better: bool, tracker: Tracker, tracking_uri: str, run_id: str
    ):
        self.name = name
        self.objective = objective
        self.lower_is_better = lower_is_better
        self.tracker = tracker
        self.tracking_uri = tracking_uri
        self.run_id = run_id

    def __call__(self, history: list[EpochResult]) -> None:
        from mlflow.tracking import MlflowClient  # noqa: PLC0415  MLflow: only a run that registers its model

        from runner.tracking.registry import register_run_model  # noqa: PLC0415  MLflow: as above

        value = self.tracker.metric_histories()[self.objective][-1][1]
        register_run_model(
            MlflowClient(self.tracking_uri), self.name, self.run_id, self.objective, value, self.lower_is_better
        )


def curves_path(run_dir: str) -> str:
    return os.path.join(run_dir, "curves.png")

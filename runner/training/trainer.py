"""One job's training run, from its built parts (runner.training.build) to a finished MLflow run.

`Trainer.run` starts (or continues) the run, builds what needs it (the end actions, the controller with the
tracker and the caller's listeners on its events), trains the remaining epochs, and ends the run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import tensorflow as tf
from omegaconf import OmegaConf

from runner.builtins import keras_lane
from runner.clusters.agreement import any_worker_stops
from runner.clusters.preemption import CoordinatedPreemption, PreemptionGuard
from runner.config.objective import Objective, Objectives
from runner.data.source import TrainingData
from runner.data.streaming import sharding_line
from runner.data.validation import VALIDATION_SPLIT_FILE
from runner.metric_table import MODEL_BYTES
from runner.outcome import model_at_sweep_end
from runner.strategy_kinds import strategy_kind
from runner.tracking.lifecycle import RunLifecycle
from runner.tracking.params import flatten
from runner.tracking.protocol import Tracker
from runner.tracking.provenance import GPU_TAG, KERAS_TAG
from runner.training.actions import (
    LogBestEpochMetrics,
    LogCheckpointModels,
    LogModel,
    ModelLogging,
    PlotCurves,
    RegisterModel,
    RestoreAndEvaluate,
    TagEarlyStopping,
    curves_path,
)
from runner.training.controller import (
    Controller,
    EndAction,
    EndActions,
    EpochPasses,
    EpochResult,
    Listener,
    Stopping,
)
from runner.training.cost import MeasureCost
from runner.training.early_stopping import EarlyStopping
from runner.training.parts import BatchPlan, Job, Restored
from runner.training.progress import EpochProgress
from runner.training.run_ending import RunEnding
from runner.training.steps import TrainingState
from runner.training.strategy import gpu_models
from runner.training.task import Experiment

log = logging.getLogger("runner")


@dataclass(frozen=True)
class RunResult:
    run_id: str | None  # None: a worker that is not the chief (it does not track)
    history: list[EpochResult]  # the epochs trained by this invocation (a resumed run skips earlier ones)
    final_metrics: dict[str, float]  # the run's last value of each metric, whichever invocation logged it
    eval_scores: dict[str, float]  # eval_<name>: the restored model's scores on the test set (empty: not restored)
    num_replicas: int
    global_batch_size: int
    learning_rate: float

    @property
    def final(self) -> EpochResult:
        return self.history[-1]


@dataclass(frozen=True)
class Trainer:
    """Everything a job trains with, built before its MLflow run exists (runner.training.build.build_trainer)."""

    job: Job
    strategy: tf.distribute.Strategy
    plan: BatchPlan
    data: TrainingData
    experiment: Experiment
    state: TrainingState
    restored: Restored
    passes: EpochPasses
    test_batches: tf.data.Dataset  # the test set's batches, for the evaluation of the restored model at the end
    origin_tags: dict[str, str]  # where the model's weights came from (init.from), as tags of the run
    early_stopping: EarlyStopping | None = None  # early_stopping.patience's state (None: off)

    def run(
        self,
        tracker: Tracker,
        overrides: Sequence[str],
        listeners: Sequence[Listener] = (),
        on_result: Callable[[RunResult], None] | None = None,
    ) -> RunResult:
        """Start (or continue) the MLflow run, train the remaining epochs, run the end-of-run actions, end the run.
        `on_result` hears the run's result as soon as it is known, before the model's export and the run's end (a
        warm sweep worker answers its job then: runner.warm_worker); a SIGTERM after that lets the ending finish."""
        stopping = _build_stopping(self.job, self.strategy)
        guard = stopping.guard
        with guard.installed():
            with guard.deferred():
                run_id = tracker.start(self.job.run_dir, _params(self), tags=_tags(self))
            _say_how_it_starts(self, run_id, tracker)
            checkpointer = self.restored.checkpointer
            if checkpointer.latest:
                # The checkpoint resumed from may have been saved after its invocation last handed anything to the
                # tracker (killed between the two): handed over again, it reaches the run as mlflow.checkpoints says.
                tracker.on_checkpoint_saved(self.restored.done_epochs, checkpointer.files(checkpointer.latest))
            model_logging = _model_logging(self, tracker, run_id)
            end = _build_end_actions(self, tracker, run_id, model_logging)
            if on_result is not None and self.job.task.chief:
                end = _announcing(end, _Announce(self, tracker, run_id, guard, on_result), _answers_with_model(self))
            controller = _build_controller(
                self, [tracker, *_checkpoint_models(self, tracker, model_logging), *listeners], stopping, end
            )
            ending = RunEnding(self.job, self.restored, tracker, run_id, end.finished, controller)
            with RunLifecycle(tracker, ending.discard_model, ending.explain):
                with guard.deferred():
                    _log_run_inputs(tracker, self.job, self.data, overrides)
                with self.passes.reaper:
                    history = controller.run()
                histories = tracker.metric_histories() if self.job.task.chief else {}
        return _result(self, run_id, history, histories, end)


def _build_stopping(job: Job, strategy: tf.distribute.Strategy) -> Stopping:
    """A MultiWorkerMirrored cluster's task trains in step with the others: any of them stopping stops them all, at
    one agreed step for a preemption (whichever task got the SIGTERM), after the epoch for the chief's pruner (the
    others have no trial to ask). Any other process stops alone."""
    if strategy_kind(job.settings.strategy.name).all_reduces_across_processes and job.task.type is not None:
        return Stopping(CoordinatedPreemption(strategy.cluster_resolver), any_worker_stops(strategy))
    return Stopping(PreemptionGuard())


def _build_end_actions(
    trainer: Trainer, tracker: Tracker, run_id: str | None, model_logging: ModelLogging | None
) -> EndActions:
    """The chief's work after the last epoch: restore and evaluate, curves, the model, its registration. A trial its
    pruner stopped keeps its curves and its checkpoint, and logs no model."""
    job, settings = trainer.job, trainer.job.settings
    if not job.task.chief:  # the kept checkpoint is the chief's
        return EndActions()
    tracking_uri = tracker.tracking_uri
    assert run_id is not None and tracking_uri is not None, "the chief's tracker has started the run"
    restored = RestoreAndEvaluate(
        trainer.restored.checkpointer,
        trainer.experiment.build_model,
        trainer.test_batches,
        tracker,
        trainer.state.epoch,
        trainer.experiment.build_scores,
        trainer.early_stopping,
        scored=trainer.experiment.scored,
        continued=trainer.restored.done_epochs >= settings.epochs,
    )
    title = f"{settings.strategy.name}, global batch {trainer.plan.global_batch}"
    table = settings.metric_table
    panels = tuple(metric.name for metric in table.model_metrics)
    curves = PlotCurves(tracker, curves_path(job.run_dir), title, trainer.state.epoch, panels)
    best_again = LogBestEpochMetrics(restored, trainer.state.epoch, tracker, table.epoch_keys())
    cost = MeasureCost(
        restored,
        trainer.experiment.export_model,
        lambda: trainer.data.raw_examples(settings.cost.latency_batch),
        tracker,
        trainer.plan.global_batch * trainer.plan.steps_per_epoch,
        settings.cost.latency_repeats,
    )
    actions: list[EndAction] = [restored, cost, curves, best_again]
    if trainer.early_stopping is not None:
        actions.insert(0, TagEarlyStopping(trainer.early_stopping, trainer.state.epoch, tracker))
    if model_logging is not None and settings.mlflow.log_model:
        if model_at_sweep_end():
            log.info("sweep.trial_models=champion: the sweep logs this run's model at its end if it is the champion")
        else:
            actions.append(LogModel(restored, model_logging, tracker))
    if settings.mlflow.register:
        goal = Objective.of(settings.sweep, settings.task.objective, table)
        objective = goal.chosen_by(validates=trainer.passes.validate is not None)
        name = settings.mlflow.registered_model_name
        actions.append(RegisterModel(name, objective, goal.lower_is_better(objective), tracker, tracking_uri, run_id))
    return EndActions(finished=actions, stopped=[curves])


@dataclass(frozen=True)
class _Announce:
    """The end action that reports the run's result (as `Trainer.run` returns it) once every number of it is known."""

    trainer: Trainer
    tracker: Tracker
    run_id: str | None
    guard: PreemptionGuard
    on_result: Callable[[RunResult], None]
    end: EndActions = EndActions()

    def __call__(self, history: list[EpochResult]) -> None:
        histories = self.tracker.metric_histories()
        self.guard.settle()
        self.on_result(_result(self.trainer, self.run_id, history, histories, self.end))


def _announcing(end: EndActions, announce: _Announce, with_model: bool = False) -> EndActions:
    """`end` with `announce` after what decides the run's numbers and before what only records them (the curves'
    picture, the model and its registration), which then overlap the next run of a warm sweep worker; `with_model`:
    after the model too, whose size is the number asked for."""
    finished = [action for action in end.finished if not isinstance(action, PlotCurves)]
    curves = [action for action in end.finished if isinstance(action, PlotCurves)]
    models = [i for i, action in enumerate(finished) if isinstance(action, LogModel)]
    first_record = (models[0] + 1 if with_model else models[0]) if models else len(finished)
    finished[first_record:first_record] = [replace(announce, end=end), *curves]
    return EndActions(finished=finished, stopped=end.stopped)


def _answers_with_model(trainer: Trainer) -> bool:
    """Whether the run's answer waits for its model: its sweep chooses or constrains on the exported model's size."""
    settings = trainer.job.settings
    goals = Objectives.of(settings.sweep, settings.task.objective, settings.metric_table)
    return MODEL_BYTES in (*goals.names, *goals.constrained_metrics)


def _checkpoint_models(trainer: Trainer, tracker: Tracker, model_logging: ModelLogging | None) -> list[Listener]:
    """mlflow.log_every_checkpoint: the chief logs each epoch's checkpoint as a LoggedModel."""
    if model_logging is None or not trainer.job.settings.mlflow.log_every_checkpoint:
        return []
    checkpointer, iterations = trainer.restored.checkpointer, trainer.state.optimizer.iterations
    return [LogCheckpointModels(tracker, checkpointer, trainer.experiment.build_model, iterations, model_logging)]


def _model_logging(trainer: Trainer, tracker: Tracker, run_id: str | None) -> ModelLogging | None:
    """How the chief logs the run's models, when it logs any (mlflow.log_model, mlflow.log_every_checkpoint)."""
    mlflow = trainer.job.settings.mlflow
    if not (trainer.job.task.chief and (mlflow.log_model or mlflow.log_every_checkpoint)):
        return None
    tracking_uri = tracker.tracking_uri
    assert run_id is not None and tracking_uri is not None, "the chief's tracker has started the run"
    return ModelLogging(trainer.experiment.export_model, trainer.data.raw_examples(5), tracking_uri, run_id)


def _build_controller(
    trainer: Trainer, listeners: Sequence[Listener], stopping: Stopping, end: EndActions
) -> Controller:
    """The run's controller; only the chief draws progress (the other tasks train the same steps in step)."""
    settings = trainer.job.settings
    progress = EpochProgress(settings.epochs, settings.progress if trainer.job.task.chief else False)
    return Controller(
        trainer.state,
        trainer.passes,
        trainer.restored.checkpointer,
        progress,
        # Early stopping last: it takes in the epoch the other listeners have logged, and its stop is checked after
        # a pruner's (a pruned trial is stopped, not finished).
        [*listeners, *([trainer.early_stopping] if trainer.early_stopping is not None else [])],
        settings.epochs,
        stopping=stopping,
        end=end,
    )


def _params(trainer: Trainer) -> dict[str, object]:
    return {
        **flatten(trainer.job.settings.composed),
        "num_replicas": trainer.strategy.num_replicas_in_sync,
        "global_batch_size": trainer.plan.global_batch,
        "learning_rate": trainer.plan.learning_rate,
    }


def _tags(trainer: Trainer) -> dict[str, str]:
    return {
        GPU_TAG: ", ".join(gpu_models()) or "none",
        KERAS_TAG: keras_lane.described(trainer.state.model),
        **trainer.origin_tags,
    }


def _say_how_it_starts(trainer: Trainer, run_id: str | None, tracker: Tracker) -> None:
    job, plan, settings = trainer.job, trainer.plan, trainer.job.settings
    if job.task.chief:
        log.info(
            "MLflow run %s in experiment %r at %s; outputs in %s",
            run_id,
            settings.mlflow.experiment_name,
            tracker.tracking_uri,
            job.run_dir,
        )
    else:
        log.info("%s of the cluster: training in step with the chief, which tracks the job", job.task.name)
    log.info(
        "strategy %s: %d replica(s), global batch %d, learning rate %.3g, %d steps per epoch%s",
        settings.strategy.name,
        trainer.strategy.num_replicas_in_sync,
        plan.global_batch,
        plan.learning_rate,
        plan.steps_per_epoch,
        _resuming(trainer),
    )
    if plan.input_workers > 1:
        log.info("%s", sharding_line(settings.dataset.name, trainer.data, plan.input_workers))


def _resuming(trainer: Trainer) -> str:
    """Where a resumed run continues, as the start's log line ends ("" for a fresh run)."""
    checkpointer = trainer.restored.checkpointer
    if not checkpointer.latest:
        return ""
    steps = int(checkpointer.partial.steps.numpy())  # of the next epoch, that a preemption checkpoint holds
    if not steps:
        and_steps = ""
    elif trainer.passes.loop.resumes_mid_epoch:
        and_steps = f" and {steps} step(s) of the next epoch"
    else:
        and_steps = f" (the {steps} steps of the preempted epoch are trained again)"
    return f"; resuming after epoch {trainer.restored.done_epochs}{and_steps} from {checkpointer.latest}"


def _log_run_inputs(tracker: Tracker, job: Job, data: TrainingData, overrides: Sequence[str]) -> None:
    """What the run was asked for: the composed config, the data, its held-out split and the command's overrides."""
    tracker.log_text(_to_yaml(job.settings.composed), "config.yaml")
    tracker.log_inputs(data.inputs())
    held_out = data.validation_split()  # a fraction or a fold: what it was, to check or reuse
    if held_out is not None:
        tracker.log_text(json.dumps(held_out), VALIDATION_SPLIT_FILE)
    tracker.log_text("".join(f"- {item}\n" for item in overrides) or "[]\n", "overrides.yaml")


def _result(
    trainer: Trainer,
    run_id: str | None,
    history: list[EpochResult],
    histories: dict[str, list[tuple[int, float]]],
    end: EndActions,
) -> RunResult:
    final_metrics = {key: points[-1][1] for key, points in histories.items()}
    restored = next((action for action in end.finished if isinstance(action, RestoreAndEvaluate)), None)
    eval_scores = restored.scores if restored else {}
    replicas, plan = trainer.strategy.num_replicas_in_sync, trainer.plan
    return RunResult(run_id, history, final_metrics, eval_scores, replicas, plan.global_batch, plan.learning_rate)


def _to_yaml(config: Mapping[str, object]) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(dict(config)))

"""One training job, from validated settings to a finished MLflow run.

The flow never looks back: settings -> strategy -> data -> state in scope -> loop -> controller,
with the MLflow tracker and the progress display as listeners on the controller's events.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from omegaconf import OmegaConf

from runner.builtins import keras_lane
from runner.clusters.agreement import any_worker_stops
from runner.clusters.preemption import AgreedStop, CoordinatedPreemption, PreemptionGuard
from runner.clusters.roles import SINGLE_PROCESS, Task
from runner.config.schema import Settings
from runner.data.in_memory import batches_per_epoch
from runner.data.loading import load_data
from runner.data.source import TrainingData
from runner.data.streaming import sharding_line
from runner.data.validation import VALIDATION_SPLIT_FILE
from runner.errors import Preempted, RunnerError
from runner.outcome import DEFAULT_OBJECTIVE, FALLBACK_OBJECTIVE, lower_is_better
from runner.tracking.lifecycle import RunLifecycle
from runner.tracking.params import flatten
from runner.tracking.protocol import Tracker
from runner.tracking.provenance import GPU_TAG, KERAS_TAG
from runner.tracking.run_id_file import read_run_id
from runner.training.actions import EndAction, LogModel, PlotCurves, RegisterModel, RestoreAndEvaluate, curves_path
from runner.training.checkpoints import Checkpointer
from runner.training.controller import Controller, EpochResult, Listener, make_evaluate, make_validate
from runner.training.determinism import make_deterministic
from runner.training.loop import CoordinatorLoop, ForInLoop, InFunctionLoop, IteratorLoop, MultiStepLoop, make_loop
from runner.training.lr_scaling import effective_learning_rate, warmup_steps
from runner.training.optimizer import prepare_optimizer
from runner.training.progress import EpochProgress
from runner.training.reaper import IteratorReaper
from runner.training.steps import ReplicaSteps, TrainingState
from runner.training.strategy import build_strategy, check_model_keras, gpu_models
from runner.training.task import ClassificationTask
from runner.training.warm_start import warm_start

log = logging.getLogger("runner")


@dataclass(frozen=True)
class RunResult:
    run_id: str | None  # None: a worker that is not the chief (it does not track)
    history: list[EpochResult]  # the epochs trained by this invocation (a resumed run skips earlier ones)
    final_metrics: dict[str, float]  # the run's last value of each metric, whichever invocation logged it
    eval_accuracy: float
    num_replicas: int
    global_batch_size: int
    learning_rate: float

    @property
    def final(self) -> EpochResult:
        return self.history[-1]


def run(
    settings: Settings,
    run_dir: str,
    tracker: Tracker,
    overrides: Sequence[str] = (),
    task: Task = SINGLE_PROCESS,
    listeners: Sequence[Listener] = (),
) -> RunResult:
    """Train as configured, outputs in run_dir, tracked by `tracker` (runner.tracking.opening.open_tracker: the
    chief's MLflow run, a NullTracker elsewhere); `overrides` are the command line's, logged with the run;
    `listeners` hear of each epoch besides the tracker (an Optuna trial's reporter, which may stop training).

    A run_dir that holds checkpoints resumes from the newest one and continues the same MLflow run. In a cluster
    every MultiWorkerMirrored worker trains, and only the chief tracks, keeps checkpoints and evaluates the
    restored model; a non-chief's result has no run id.
    """
    os.makedirs(run_dir, exist_ok=True)
    return Trainer.build(settings, run_dir, task).train(tracker, overrides, listeners)


# How an epoch's steps are driven (runner.training.loop).
TrainingLoop = ForInLoop | InFunctionLoop | IteratorLoop | MultiStepLoop | CoordinatorLoop


@dataclass(frozen=True)
class BatchPlan:
    """How the data is cut into steps: the global batch, the steps of an epoch, the effective learning rate (and
    how many MultiWorkerMirrored workers split the training set: 1, no split)."""

    global_batch: int
    steps_per_epoch: int
    learning_rate: float  # optimizer.lr scaled by lr_scaling
    input_workers: int


@dataclass(frozen=True)
class Trainer:
    """Everything a job trains with, built before its MLflow run exists: a setup error leaves no run behind."""

    settings: Settings
    run_dir: str
    task: Task
    strategy: tf.distribute.Strategy
    data: TrainingData
    experiment: ClassificationTask
    state: TrainingState
    loop: TrainingLoop
    evaluate: Callable[[], None]
    test_batches: tf.data.Dataset
    checkpointer: Checkpointer
    done_epochs: int  # epochs restored from the run directory's checkpoints (0: a fresh run)
    plan: BatchPlan
    origin_tags: dict[str, str]  # where the model's weights came from (init.from), as tags of the run
    reaper: IteratorReaper  # releases the loop's and the evaluations' finished iterators while training goes on
    validate: Callable[[], tuple[float, float]] | None = None  # the validation split's pass, if the data has one

    @classmethod
    def build(cls, settings: Settings, run_dir: str, task: Task) -> Trainer:
        """settings -> strategy -> data -> task -> state in scope -> steps -> loop, restored from run_dir."""
        strategy = build_strategy(settings.strategy, task.resolver, settings.cluster.timeout_seconds)
        if settings.runtime.deterministic:
            make_deterministic(settings.runtime, settings.seed)
        workers = _input_workers(settings, task)
        training_data = load_data(settings.dataset, settings.seed, workers)
        experiment = ClassificationTask.from_settings(settings, training_data.spec)
        global_batch = settings.batch * strategy.num_replicas_in_sync
        steps_per_epoch = settings.loop.steps_per_epoch or _steps_per_epoch(training_data, global_batch)
        plan = BatchPlan(
            global_batch,
            steps_per_epoch,
            effective_learning_rate(settings.optimizer.lr, global_batch, settings.lr_scaling),
            workers,
        )
        state = _state_in_scope(settings, strategy, experiment, plan)
        steps = ReplicaSteps(
            strategy, state, global_batch, experiment.per_example_loss, jit_compile=settings.runtime.jit_compile
        )
        checkpointer = Checkpointer(
            os.path.join(run_dir, "checkpoints"), state, settings.checkpoint, settings.epochs, scratch=not task.chief
        )
        done_epochs = _resume(settings, checkpointer, run_dir)
        # Before the MLflow run exists: a source that cannot be found or does not fit leaves no run behind.
        origin = warm_start(settings.init, state.model, settings.mlflow.tracking_uri, resumed_from=checkpointer.latest)
        test_batches = training_data.test_dataset(global_batch)
        reaper = IteratorReaper()
        loop, evaluate = _loop_and_evaluation(
            settings, strategy, steps, training_data, plan, test_batches, checkpointer, done_epochs, reaper
        )
        return cls(
            settings=settings,
            run_dir=run_dir,
            task=task,
            strategy=strategy,
            data=training_data,
            experiment=experiment,
            state=state,
            loop=loop,
            evaluate=evaluate,
            test_batches=test_batches,
            checkpointer=checkpointer,
            done_epochs=done_epochs,
            plan=plan,
            origin_tags=origin.tags if origin else {},
            reaper=reaper,
            validate=_validation(settings, strategy, steps, state, training_data, global_batch, reaper),
        )

    def end_actions(self, tracker: Tracker, run_id: str | None) -> list[EndAction]:
        """The chief's work after the last epoch: restore and evaluate, curves, the model, its registration."""
        if not self.task.chief:  # the kept checkpoint is the chief's
            return []
        settings, tracking_uri = self.settings, tracker.tracking_uri
        assert run_id is not None and tracking_uri is not None, "the chief's tracker has started the run"
        restored = RestoreAndEvaluate(
            self.checkpointer, self.experiment.build_model, self.test_batches, tracker, settings.epochs
        )
        title = f"{settings.strategy.name}, global batch {self.plan.global_batch}"
        actions: list[EndAction] = [restored, PlotCurves(tracker, curves_path(self.run_dir), title)]
        if settings.mlflow.log_model:
            examples = self.data.raw_examples(5)
            export = self.experiment.export_model
            actions.append(LogModel(restored, export, examples, tracker, tracking_uri, run_id, settings.epochs))
        if settings.mlflow.register:
            default = DEFAULT_OBJECTIVE if self.validate is not None else FALLBACK_OBJECTIVE
            objective = settings.sweep.objective or default
            name = settings.mlflow.registered_model_name
            actions.append(RegisterModel(name, objective, lower_is_better(objective), tracker, tracking_uri, run_id))
        return actions

    def train(self, tracker: Tracker, overrides: Sequence[str], listeners: Sequence[Listener] = ()) -> RunResult:
        """Start (or continue) the MLflow run, train the remaining epochs, run the end-of-run actions, end the run."""
        guard = self._guard()
        with guard.installed():
            with guard.deferred():
                run_id = tracker.start(self.run_dir, self._params(), tags=self._tags())
            self._say_how_it_starts(run_id, tracker)
            if self.checkpointer.latest:
                # The checkpoint resumed from may have been saved after its invocation last handed anything to the
                # tracker (killed between the two): handed over again, it reaches the run as mlflow.checkpoints says.
                tracker.on_checkpoint_saved(self.done_epochs, self.checkpointer.files(self.checkpointer.latest))
            actions = self.end_actions(tracker, run_id)
            progress = EpochProgress(self.settings.epochs, self.settings.progress if self.task.chief else False)
            controller = Controller(
                self.state,
                self.loop,
                self.evaluate,
                self.checkpointer,
                progress,
                [tracker, *listeners],
                self.settings.epochs,
                guard,
                end_actions=actions,
                validate=self.validate,
                # A trial its pruner stopped keeps its curves and its checkpoint, and logs no model.
                stop_actions=[action for action in actions if isinstance(action, PlotCurves)],
                agree_to_stop=self._agreement(),
                release_iterators=self._release_iterators,
            )
            ending = _RunEnding(self, tracker, run_id, actions, controller)
            with RunLifecycle(tracker, ending.discard_model, ending.explain):
                with guard.deferred():
                    tracker.log_text(_to_yaml(self.settings.composed), "config.yaml")
                    tracker.log_inputs(self.data.inputs())
                    held_out = self.data.validation_split()  # a fraction or a fold: what it was, to check or reuse
                    if held_out is not None:
                        tracker.log_text(json.dumps(held_out), VALIDATION_SPLIT_FILE)
                    tracker.log_text("".join(f"- {item}\n" for item in overrides) or "[]\n", "overrides.yaml")
                with self.reaper:
                    history = controller.run()
                histories = tracker.metric_histories() if self.task.chief else {}
        final_metrics = {key: points[-1][1] for key, points in histories.items()}
        restored = next((action for action in actions if isinstance(action, RestoreAndEvaluate)), None)
        eval_accuracy = restored.accuracy if restored else float("nan")
        replicas, plan = self.strategy.num_replicas_in_sync, self.plan
        return RunResult(run_id, history, final_metrics, eval_accuracy, replicas, plan.global_batch, plan.learning_rate)

    def _release_iterators(self) -> None:
        """After the last epoch: the iterator loops' run-long iterator, and the last pass's, start their release."""
        if isinstance(self.loop, IteratorLoop):  # and MultiStepLoop
            self.loop.finish()
        self.reaper.flush()

    @property
    def _workers_in_step(self) -> bool:
        """A MultiWorkerMirrored cluster's task: its workers train in step, so any of them stopping stops them all."""
        return self.settings.strategy.name == "multi_worker_mirrored" and self.task.type is not None

    def _agreement(self) -> Callable[[bool], bool] | None:
        """MultiWorkerMirrored: a stop the chief's pruner decides after an epoch is every worker's (the others have no
        trial to ask), as a preemption's is."""
        return any_worker_stops(self.strategy) if self._workers_in_step else None

    def _guard(self) -> PreemptionGuard:
        """MultiWorkerMirrored: every worker stops at one agreed step, whichever task got the SIGTERM."""
        if self._workers_in_step:
            return CoordinatedPreemption(self.strategy.cluster_resolver)
        return PreemptionGuard()

    def _params(self) -> dict[str, object]:
        return {
            **flatten(self.settings.composed),
            "num_replicas": self.strategy.num_replicas_in_sync,
            "global_batch_size": self.plan.global_batch,
            "learning_rate": self.plan.learning_rate,
        }

    def _tags(self) -> dict[str, str]:
        return {
            GPU_TAG: ", ".join(gpu_models()) or "none",
            KERAS_TAG: keras_lane.described(self.state.model),
            **self.origin_tags,
        }

    def _say_how_it_starts(self, run_id: str | None, tracker: Tracker) -> None:
        settings, checkpointer, plan = self.settings, self.checkpointer, self.plan
        if self.task.chief:
            log.info(
                "MLflow run %s in experiment %r at %s; outputs in %s",
                run_id,
                settings.mlflow.experiment_name,
                tracker.tracking_uri,
                self.run_dir,
            )
        else:
            log.info("%s of the cluster: training in step with the chief, which tracks the job", self.task.name)
        resuming = (
            f"; resuming after epoch {self.done_epochs}{_and_steps(checkpointer, self.loop)} from {checkpointer.latest}"
            if checkpointer.latest
            else ""
        )
        log.info(
            "strategy %s: %d replica(s), global batch %d, learning rate %.3g, %d steps per epoch%s",
            settings.strategy.name,
            self.strategy.num_replicas_in_sync,
            plan.global_batch,
            plan.learning_rate,
            plan.steps_per_epoch,
            resuming,
        )
        if plan.input_workers > 1:
            log.info("%s", sharding_line(settings.dataset.name, self.data, plan.input_workers))


@dataclass(frozen=True)
class _RunEnding:
    """How a run that does not finish ends: its model discarded, its error worded for the user."""

    trainer: Trainer
    tracker: Tracker
    run_id: str | None
    actions: list[EndAction]
    controller: Controller

    def discard_model(self) -> None:
        """A run that ends FAILED or KILLED keeps no model. Only a run past its last epoch can have one: logged by
        this invocation, or by an earlier one that had trained every epoch."""
        trainer = self.trainer
        logged = any(isinstance(action, LogModel) and action.logged is not None for action in self.actions)
        if trainer.task.chief and (logged or trainer.done_epochs >= trainer.settings.epochs):
            from runner.tracking.model_export import discard_run_model  # MLflow: only for a run that ends early

            tracking_uri = self.tracker.tracking_uri
            assert self.run_id is not None and tracking_uri is not None, "the chief's tracker has started the run"
            discard_run_model(tracking_uri, self.run_id)

    def explain(self, error: BaseException) -> BaseException:
        task, checkpointer, run_dir = self.trainer.task, self.trainer.checkpointer, self.trainer.run_dir
        again = f"start every task again with the same command and hydra.run.dir={run_dir}"
        if isinstance(error, AgreedStop) and not task.chief:
            saved = os.path.join(checkpointer.directory, f"ckpt-{error.step}")
            return Preempted(
                f"{task.name} stopped at global step {error.step} for the preemption of {error.signalled} "
                f"(SIGTERM), in step with every worker; the chief saved {saved} and marks the job's MLflow "
                f"run KILLED and resumable: {again}"
            )
        if isinstance(error, AgreedStop):
            return Preempted(
                f"stopped at global step {error.step} for the preemption of {error.signalled} (SIGTERM), "
                f"every worker in step, after saving {checkpointer.latest}; MLflow run {self.run_id} is KILLED "
                f"and resumable: {again}"
            )
        if isinstance(error, Preempted):
            return Preempted(
                f"stopped by SIGTERM after saving {checkpointer.latest}; MLflow run {self.run_id} is "
                f"KILLED and resumable: re-run the same command with hydra.run.dir={run_dir}"
            )
        if isinstance(error, _PEER_FAILURES) and task.type is not None:  # one process: no peer to blame
            failure = _peer_failure(error, task, self.controller.epoch, checkpointer.latest, run_dir)
            # Free TensorFlow's frames now: they hold the thread pool of the aborted all-reduce, which would
            # otherwise be collected at interpreter exit and print its own traceback after our paragraph.
            error.__traceback__ = None
            return failure
        return error


# What a collective or a remote op raises when another task of the cluster died or stopped answering.
_PEER_FAILURES = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.DeadlineExceededError)


def _peer_failure(
    error: tf.errors.OpError, task: Task, epoch: int | None, latest: str | None, run_dir: str
) -> RunnerError:
    """The one paragraph for a cluster that lost a task mid-run (TensorFlow's message names the task)."""
    reason = " ".join(re.sub(r"\{\{[^}]*\}\}", " ", _without_stack(error.message)).split())
    if len(reason) > 400:
        reason = reason[:400] + "..."
    kept = f"the checkpoints up to {latest} are kept" if latest else "no checkpoint had been written yet"
    return RunnerError(
        f"another task of the cluster failed or stopped answering "
        f"{f'during epoch {epoch}' if epoch else 'before training started'}, so {task.name} stopped "
        f"too ({type(error).__name__}: {reason}); {kept}. Fix: find the cause in the failed task's log, then "
        f"start every task again with the same command and hydra.run.dir={run_dir} to resume from the last "
        "checkpoint."
    )


def _without_stack(message: str) -> str:
    """TensorFlow's own words: an error raised inside a tf.function starts with "Graph execution error:" and,
    per node, "Detected at node ... defined at (most recent call last):" and the Python stack that built
    it, which would fill the paragraph and push out the cause (the task that stopped answering)."""
    kept, in_stack = [], False
    for line in message.splitlines():
        if line.startswith("Detected at node "):
            in_stack = True
        elif in_stack and (not line.strip() or line.startswith(" ") or line == "<stack traces unavailable>"):
            pass
        elif line.strip() != "Graph execution error:":
            in_stack = False
            kept.append(line)
    return "\n".join(kept)


def _state_in_scope(
    settings: Settings, strategy: tf.distribute.Strategy, experiment: ClassificationTask, plan: BatchPlan
) -> TrainingState:
    """The model, optimizer and metrics created in the strategy's scope, seeded: same seed, same initial weights."""
    policy = settings.runtime.mixed_precision
    with strategy.scope():
        # Same seed, same initial weights, any strategy; the built-in model in runtime.keras's Keras.
        keras_lane.prepare(policy or "float32", settings.seed, settings.runtime.keras)
        model = experiment.build_model()
        check_model_keras(settings.strategy.name, model, settings.model.target)  # before the learning rate
        total_steps = plan.steps_per_epoch * settings.epochs
        rate = experiment.learning_rate(
            plan.learning_rate, total_steps, warmup_steps(plan.steps_per_epoch, settings.lr_scaling)
        )
        return TrainingState.create(
            lambda: model,
            lambda variables: prepare_optimizer(
                experiment.build_optimizer(rate), variables, loss_scaling=policy == "mixed_float16"
            ),
        )


def _loop_and_evaluation(
    settings: Settings,
    strategy: tf.distribute.Strategy,
    steps: ReplicaSteps,
    training_data: TrainingData,
    plan: BatchPlan,
    test_batches: tf.data.Dataset,
    checkpointer: Checkpointer,
    done_epochs: int,
    reaper: IteratorReaper,
) -> tuple[TrainingLoop, Callable[[], None]]:
    """The loop style's loop over the training set, and the evaluation of the test set after each epoch."""
    global_batch, seed = plan.global_batch, settings.seed
    if settings.strategy.name == "parameter_server":
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        dataset_fn = _worker_dataset_fn(training_data, global_batch, seed)
        loop: TrainingLoop = CoordinatorLoop(steps, coordinator, dataset_fn, plan.steps_per_epoch)
        return loop, make_evaluate(steps, test_batches, reaper, inline=True)

    def distributed_train_dataset(**epochs: Any) -> tf.distribute.DistributedDataset:
        return strategy.experimental_distribute_dataset(training_data.train_dataset(global_batch, seed, **epochs))

    loop = make_loop(
        settings.loop.style,
        steps,
        distributed_train_dataset,
        plan.steps_per_epoch,
        settings.loop.steps_per_call,
        done_epochs,
        int(checkpointer.partial.steps.numpy()),
        reaper=reaper,
        # A TPU's input pipeline runs on its host, which cannot read a variable of this process.
        epoch_read_when_iterated=training_data.epoch_read_when_iterated and settings.strategy.name != "tpu",
    )
    return loop, make_evaluate(steps, strategy.experimental_distribute_dataset(test_batches), reaper)


def _validation(
    settings: Settings,
    strategy: tf.distribute.Strategy,
    steps: ReplicaSteps,
    state: TrainingState,
    training_data: TrainingData,
    global_batch: int,
    reaper: IteratorReaper,
) -> Callable[[], tuple[float, float]] | None:
    """The validation split's pass after each epoch (dataset.validation_fraction), or None without one."""
    batches = training_data.validation_dataset(global_batch)
    if batches is None:
        return None
    if settings.strategy.name == "parameter_server":
        return make_validate(steps, state, batches, reaper, inline=True)
    return make_validate(steps, state, strategy.experimental_distribute_dataset(batches), reaper)


def _input_workers(settings: Settings, task: Task) -> int:
    """How many MultiWorkerMirrored workers split the training set (each reads its own part of it)."""
    if settings.strategy.name != "multi_worker_mirrored" or task.resolver is None:
        return 1
    cluster = task.resolver.cluster_spec().as_dict()
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def _and_steps(checkpointer: Checkpointer, loop: TrainingLoop) -> str:
    """The steps of the next epoch that a preemption checkpoint holds, as the resume message says them."""
    steps = int(checkpointer.partial.steps.numpy())
    if not steps:
        return ""
    if not getattr(loop, "resumes_mid_epoch", True):
        return f" (the {steps} steps of the preempted epoch are trained again)"
    return f" and {steps} step(s) of the next epoch"


def _steps_per_epoch(training_data: TrainingData, global_batch: int) -> int:
    if training_data.train_examples is None:
        raise RunnerError(
            f"dataset.name={training_data.spec.name!r} streams examples without saying how many there are, so an "
            "epoch has no natural end. Fix: pass loop.steps_per_epoch=N, or dataset.train_examples=N."
        )
    return batches_per_epoch(training_data.train_examples, global_batch)


def _worker_dataset_fn(
    training_data: TrainingData, global_batch: int, seed: int
) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """ParameterServerStrategy: the dataset function each worker builds its own endless dataset with."""

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        # ClusterCoordinator gives every worker this same function and InputContext: a seed drawn from the
        # worker's clock when it builds the dataset makes each worker shuffle differently, instead of all
        # training on the same batches (asynchronous training is not reproducible anyway).
        worker_seed = seed + tf.cast(tf.timestamp() * 1e6, tf.int64) % 2**31
        return training_data.train_dataset(
            context.get_per_replica_batch_size(global_batch), worker_seed, epochs=None, input_context=context
        )

    return dataset_fn


def _resume(settings: Settings, checkpointer: Checkpointer, run_dir: str) -> int:
    """The number of epochs already trained in run_dir (restored into the state), 0 for a fresh run."""
    if settings.resume == "never":
        # Only checkpoints count: a run id alone (a sweep job's run, created before it trains) holds no
        # training that this run could overwrite.
        if checkpointer.exists:
            earlier_run = read_run_id(run_dir)
            earlier = f"MLflow run {earlier_run}, " if earlier_run else ""
            raise RunnerError(
                f"resume=never, but {run_dir} already holds checkpoints of an earlier run ({earlier}newest "
                f"{checkpointer.listed[-1]}), which this run would overwrite. Fix: leave hydra.run.dir unset so a "
                "new directory is made, pick a new one, or use resume=auto to continue that run."
            )
        return 0
    return checkpointer.restore()


def _to_yaml(config: Mapping[str, object]) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(dict(config)))

"""A job's Trainer, built part by part before its MLflow run exists (a setup error leaves no run behind):
settings -> strategy -> data -> task -> batch plan -> state in scope -> steps -> checkpoints -> passes.

Each `_build_*` returns one typed part; the order is the one TensorFlow sees, which keeps a seeded run's numbers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import tensorflow as tf

from runner.builtins import keras_lane
from runner.clusters.roles import Task
from runner.config.schema import Settings
from runner.data.in_memory import batches_per_epoch
from runner.data.loading import load_data
from runner.data.source import TrainingData
from runner.errors import RunnerError
from runner.strategy_kinds import strategy_kind
from runner.tracking.run_id_file import read_run_id
from runner.training.checkpoints import Checkpointer
from runner.training.controller import EpochPasses, make_evaluate, make_validate
from runner.training.determinism import make_deterministic
from runner.training.early_stopping import EarlyStopping, watch_of
from runner.training.loop import CoordinatorLoop, TrainingLoop, make_loop
from runner.training.lr_scaling import effective_learning_rate, warmup_steps
from runner.training.optimizer import prepare_optimizer
from runner.training.parts import BatchPlan, Job, Restored
from runner.training.reaper import IteratorReaper
from runner.training.steps import ReplicaSteps, TrainingState
from runner.training.strategy import build_strategy, check_model_keras
from runner.training.task import Experiment
from runner.training.trainer import Trainer
from runner.training.warm_start import warm_start


def build_trainer(job: Job) -> Trainer:
    """Every part `job` trains with, its run directory's checkpoints restored (resumed) or its init.from loaded."""
    settings = job.settings
    strategy = _build_strategy(settings, job.task)
    workers = _input_workers(settings, job.task)
    data = load_data(settings.dataset, settings.seed, workers, settings.task.kind)
    experiment = Experiment.from_settings(settings, data.spec)
    plan = _build_plan(settings, strategy, data, workers)
    state = _build_state(settings, strategy, experiment, plan)
    steps = ReplicaSteps(
        strategy,
        state,
        plan.global_batch,
        experiment.per_example_loss,
        jit_compile=settings.runtime.jit_compile,
        scored=experiment.scored,
    )
    early_stopping = _build_early_stopping(settings, data, state)
    restored = _build_restored(job, state, early_stopping)
    # Before the MLflow run exists: a source that cannot be found or does not fit leaves no run behind.
    origin = warm_start(
        settings.init, state.model, settings.mlflow.tracking_uri, resumed_from=restored.checkpointer.latest
    )
    test_batches = data.test_dataset(plan.global_batch)
    experiment.check_scores(test_batches)  # before the MLflow run exists, as above
    passes = _build_passes(settings, steps, data, plan, test_batches, restored)
    return Trainer(
        job=job,
        strategy=strategy,
        plan=plan,
        data=data,
        experiment=experiment,
        state=state,
        restored=restored,
        passes=passes,
        test_batches=test_batches,
        origin_tags=origin.tags if origin else {},
        early_stopping=early_stopping,
    )


def _build_strategy(settings: Settings, task: Task) -> tf.distribute.Strategy:
    """The strategy, then op determinism where runtime.deterministic asks for it (seeded)."""
    strategy = build_strategy(settings.strategy, task.resolver, settings.cluster.timeout_seconds)
    if settings.runtime.deterministic:
        make_deterministic(settings.runtime, settings.seed)
    return strategy


def _input_workers(settings: Settings, task: Task) -> int:
    """How many MultiWorkerMirrored workers split the training set (each reads its own part of it)."""
    if not strategy_kind(settings.strategy.name).all_reduces_across_processes or task.resolver is None:
        return 1
    cluster = task.resolver.cluster_spec().as_dict()
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def _build_plan(settings: Settings, strategy: tf.distribute.Strategy, data: TrainingData, workers: int) -> BatchPlan:
    global_batch = settings.batch * strategy.num_replicas_in_sync
    return BatchPlan(
        global_batch,
        settings.loop.steps_per_epoch or _steps_per_epoch(data, global_batch),
        effective_learning_rate(settings.optimizer.lr, global_batch, settings.lr_scaling),
        workers,
    )


def _steps_per_epoch(data: TrainingData, global_batch: int) -> int:
    if data.train_examples is None:
        raise RunnerError(
            f"dataset.name={data.spec.name!r} streams examples without saying how many there are, so an "
            "epoch has no natural end. Fix: pass loop.steps_per_epoch=N, or dataset.train_examples=N."
        )
    return batches_per_epoch(data.train_examples, global_batch)


def _build_state(
    settings: Settings, strategy: tf.distribute.Strategy, experiment: Experiment, plan: BatchPlan
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
            experiment.build_scores,
            experiment.spec.outputs,
        )


def _build_early_stopping(settings: Settings, data: TrainingData, state: TrainingState) -> EarlyStopping | None:
    """The state of early stopping and checkpoint.keep_best (None: neither); before the run exists, so that a
    monitor the data cannot give leaves no run behind."""
    watch = watch_of(
        settings.early_stopping,
        settings.checkpoint,
        settings.sweep.chosen,
        data.has_validation,
        settings.metric_table,
    )
    return EarlyStopping(watch, state.model) if watch is not None else None


def _build_restored(job: Job, state: TrainingState, early_stopping: EarlyStopping | None = None) -> Restored:
    """The run directory's checkpointer (a scratch one on a worker that is not the chief), the state restored from
    its newest checkpoint, if any; early stopping's state is kept with each checkpoint."""
    settings = job.settings
    checkpointer = Checkpointer(
        os.path.join(job.run_dir, "checkpoints"),
        state,
        settings.checkpoint,
        settings.epochs,
        scratch=not job.task.chief,
        extra={"early_stopping": early_stopping} if early_stopping is not None else None,
    )
    return Restored(checkpointer, _resume(settings, checkpointer, job.run_dir))


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


def _build_passes(
    settings: Settings,
    steps: ReplicaSteps,
    data: TrainingData,
    plan: BatchPlan,
    test_batches: tf.data.Dataset,
    restored: Restored,
) -> EpochPasses:
    """The loop style's pass over the training set, then the evaluations after each epoch: the validation split's
    (dataset.validation_fraction, if any) and the test set's. ParameterServerStrategy's coordinator runs the
    replica steps itself over plain batches (`inline`), reading the variables from the parameter servers."""
    reaper = IteratorReaper()
    inline = strategy_kind(settings.strategy.name).coordinated
    loop = _build_loop(settings, steps, data, plan, restored, reaper)
    evaluate = make_evaluate(steps, _distributed(steps, test_batches, inline), reaper, inline=inline)
    validation_batches = data.validation_dataset(plan.global_batch)
    validate = (
        None
        if validation_batches is None
        else make_validate(steps, steps.state, _distributed(steps, validation_batches, inline), reaper, inline=inline)
    )
    return EpochPasses(loop, evaluate, validate, reaper)


def _distributed(steps: ReplicaSteps, batches: tf.data.Dataset, inline: bool) -> Iterable[Any]:
    """An evaluation's batches as its step takes them: plain for the coordinator's inline step, else distributed."""
    return batches if inline else steps.strategy.experimental_distribute_dataset(batches)


def _build_loop(
    settings: Settings,
    steps: ReplicaSteps,
    data: TrainingData,
    plan: BatchPlan,
    restored: Restored,
    reaper: IteratorReaper,
) -> TrainingLoop:
    """The loop style's loop over the training set, ready to train the epoch after the restored ones."""
    global_batch, seed, strategy = plan.global_batch, settings.seed, steps.strategy
    if strategy_kind(settings.strategy.name).coordinated:
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        dataset_fn = _worker_dataset_fn(data, global_batch, seed)
        return CoordinatorLoop(steps, coordinator, dataset_fn, plan.steps_per_epoch)

    def distributed_train_dataset(**epochs: Any) -> tf.distribute.DistributedDataset:
        return strategy.experimental_distribute_dataset(data.train_dataset(global_batch, seed, **epochs))

    return make_loop(
        settings.loop.style,
        steps,
        distributed_train_dataset,
        plan.steps_per_epoch,
        settings.loop.steps_per_call,
        restored.done_epochs,
        int(restored.checkpointer.partial.steps.numpy()),
        reaper=reaper,
        # A TPU's input pipeline runs on its host, which cannot read a variable of this process.
        epoch_read_when_iterated=data.epoch_read_when_iterated
        and strategy_kind(settings.strategy.name).pipeline_in_process,
    )


def _worker_dataset_fn(
    data: TrainingData, global_batch: int, seed: int
) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """ParameterServerStrategy: the dataset function each worker builds its own endless dataset with."""

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        # ClusterCoordinator gives every worker this same function and InputContext: a seed drawn from the
        # worker's clock when it builds the dataset makes each worker shuffle differently, instead of all
        # training on the same batches (asynchronous training is not reproducible anyway).
        worker_seed = seed + tf.cast(tf.timestamp() * 1e6, tf.int64) % 2**31
        return data.train_dataset(
            context.get_per_replica_batch_size(global_batch), worker_seed, epochs=None, input_context=context
        )

    return dataset_fn

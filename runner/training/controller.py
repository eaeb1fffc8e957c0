"""The cadence of training: epochs, evaluation, checkpoints, and the events other parts listen to.

The controller owns *when* things happen; what happens inside a step belongs to steps.py and loop.py,
and side effects (MLflow, progress) are listeners called with each epoch's result.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import tensorflow as tf

from runner.clusters.preemption import AgreedStop, PreemptionGuard
from runner.compat.keras_metrics import build_for_outputs
from runner.errors import Preempted, RunnerError
from runner.training.checkpoints import Checkpointer
from runner.training.loop import TrainingLoop
from runner.training.optimizer import current_learning_rate
from runner.training.progress import EpochProgress
from runner.training.reaper import IteratorReaper
from runner.training.steps import NON_FINITE_LOSS, ReplicaSteps, TrainingState


@dataclass(frozen=True)
class EpochResult:
    epoch: int
    # The model's metrics by their logged names (runner.metric_table): train_loss and each score's train_<name>,
    # then val_* (only where the run has a validation split) and test_*, in the table's order.
    model_metrics: dict[str, float]
    examples_per_second: float
    learning_rate: float
    steps: int
    examples: int
    train_seconds: float

    def __getitem__(self, key: str) -> float:
        """A model metric by its logged name: result["val_accuracy"]."""
        return self.model_metrics[key]

    @property
    def train_loss(self) -> float:
        return self.model_metrics["train_loss"]

    def metrics(self) -> dict[str, float]:
        """The per-epoch metrics logged to MLflow (val_* only where the run has a validation split)."""
        speed = {"examples_per_second": self.examples_per_second, "learning_rate": self.learning_rate}
        return {**self.model_metrics, **speed}


class Listener(Protocol):
    def on_epoch_end(self, result: EpochResult) -> None: ...
    def on_checkpoint_saved(self, epoch: int, files: list[str]) -> None: ...


@runtime_checkable
class StopsTraining(Protocol):
    """A listener that may end training early at an epoch boundary: a sweep's pruned trial
    (runner.sweeps.study.pruning.TrialReporter: the run is stopped, its `stopped` end actions run) or early stopping
    (runner.training.early_stopping.EarlyStopping, which `finishes` the run: its `finished` end actions run, and a
    run restored in that state trains no further epoch). A listener without `stop_requested` never stops it."""

    @property
    def stop_requested(self) -> bool: ...

    @property
    def finishes(self) -> bool: ...


def _asking_to_stop(listeners: Iterable[Listener]) -> list[StopsTraining]:
    """The listeners that may stop training and ask to, after this epoch."""
    return [listener for listener in listeners if isinstance(listener, StopsTraining) and listener.stop_requested]


# What the controller calls with the run's history once training ends (the actions of runner.training.actions).
EndAction = Callable[[list[EpochResult]], None]


@dataclass(frozen=True)
class EpochPasses:
    """What each epoch runs: the loop's pass over the training set, then the validation split's pass (make_validate;
    None where the data has no validation split) and the test pass (make_evaluate). `reaper` releases their
    finished iterators while training goes on."""

    loop: TrainingLoop
    evaluate: Callable[[], None]
    validate: Callable[[], dict[str, float]] | None
    reaper: IteratorReaper

    def release_iterators(self) -> None:
        """After the last epoch: the iterators the run still holds start their release, which then overlaps the
        end actions."""
        self.loop.finish()
        self.reaper.flush()


@dataclass(frozen=True)
class Stopping:
    """How training stops before its last epoch. `guard` turns a SIGTERM into a stop at a safe point; in a cluster
    whose workers train in step (runner.clusters.agreement), `agree` makes any worker's wish to stop after an epoch
    every worker's (None: this process decides alone)."""

    guard: PreemptionGuard
    agree: Callable[[bool], bool] | None = None


@dataclass(frozen=True)
class EndActions:
    """What runs, in order, with the history once training ends (runner.training.actions; a SIGTERM waits for them):
    `finished` after the last epoch, `stopped` instead when a listener stopped training early (a pruned trial)."""

    finished: Sequence[EndAction] = ()
    stopped: Sequence[EndAction] = ()


class Diverged(RunnerError):
    """The loss became NaN or infinite; training stopped before the bad step touched the weights."""


def without_deterministic_kernel(error: tf.errors.UnimplementedError) -> RunnerError:
    """runtime.deterministic met an op TensorFlow has no deterministic kernel for (with runtime.jit_compile: XLA's
    MaxPool gradient, among others), which TensorFlow reports only when the step first runs."""
    said = next(line.strip() for line in error.message.splitlines() if "determinis" in line).rstrip(".")
    under_xla = "XLA" in said or "tf2xla" in error.message
    fix = (
        "drop runtime.jit_compile=true (without XLA this op has a deterministic kernel), or drop runtime.deterministic"
        if under_xla
        else "drop runtime.deterministic=true, or use a model without this op"
    )
    return RunnerError(
        f"runtime.deterministic=true cannot train this model: TensorFlow has no deterministic kernel for one of its "
        f'ops{" under XLA (runtime.jit_compile=true)" if under_xla else ""}: "{said}". Fix: {fix}.',
        key="runtime.deterministic",
    )


class _StepBoundaries:
    """What a loop reports after each step (or call of steps): the progress, then the safe point where a
    SIGTERM stops training. It keeps how far the epoch has got (steps, the running sum of their losses),
    what a preemption checkpoint records."""

    def __init__(self, progress: EpochProgress, guard: PreemptionGuard, steps: int = 0, total: tf.Tensor | float = 0.0):
        self.progress = progress
        self.guard = guard
        self.steps = steps
        self.total = total

    def advance(self, steps: int, loss: Any, total: tf.Tensor | float) -> None:
        self.steps += steps
        self.total = total
        self.progress.advance(steps, loss)
        self.guard.at_step_boundary()


class ScoreResults:
    """A score's result from its state's values (runner.training.controller.Controller._train_scores): a copy of
    each training score, made outside any strategy, whose variables are set to the values before it computes.
    `outputs`: the model's output shape for one example, for a score that makes its state on its first update
    (runner.compat.keras_metrics)."""

    def __init__(self, scores: dict[str, Any], outputs: tuple[int, ...] = ()):
        self._scores = scores
        self._outputs = outputs
        self._copies: dict[str, Any] = {}

    def result(self, name: str, values: list[tf.Tensor]) -> float:
        if name not in self._copies:
            metric = self._scores[name]
            copy = type(metric).from_config(metric.get_config())
            build_for_outputs(copy, self._outputs)
            self._copies[name] = copy
        copy = self._copies[name]
        for variable, value in zip(copy.variables, values, strict=True):
            variable.assign(value)
        return float(copy.result())


class _Stop(enum.Enum):
    """Why training stops before its last epoch: a listener stopped it (a pruned trial: the run's `stopped` end
    actions), or one finished it (early stopping: the `finished` ones, the run is done)."""

    LISTENER = "listener"
    FINISHED = "finished"


class Controller:
    """When things happen (Orbit's Controller): each epoch's passes, the checkpoints' cadence, the listeners'
    events, a stop at a safe point, and the end actions."""

    def __init__(
        self,
        state: TrainingState,
        passes: EpochPasses,
        checkpointer: Checkpointer,
        progress: EpochProgress,
        listeners: Sequence[Listener],
        epochs: int,
        *,
        stopping: Stopping,
        end: EndActions,
    ):
        self.state = state
        self.passes = passes
        self.checkpointer = checkpointer
        self.progress = progress
        self.listeners = list(listeners)
        self.epochs = epochs
        self.stopping = stopping
        self.end = end
        self.stopped_at: int | None = None  # the epoch after which a listener stopped training early
        self.epoch: int | None = None  # the epoch being trained, once training has started
        # A preemption mid-epoch checkpoints how far the epoch got (checkpointer.partial), and the resume
        # continues it; a loop that cannot (ParameterServer's) starts the epoch over.
        self.resumes_mid_epoch = passes.loop.resumes_mid_epoch
        self._boundaries: _StepBoundaries | None = None  # while an epoch's steps run
        self._results = ScoreResults(state.train_scores, state.outputs)

    def _train_scores(self, done_steps: int) -> dict[str, list[tf.Tensor]]:
        """Each training score's state over the epoch's steps: its variables now (summed over replicas and workers),
        plus, for an epoch resumed after `done_steps` steps, the state the checkpoint kept of them. A Keras metric's
        state is sums (totals and counts, confusion counts), so the two add up to the uninterrupted epoch's: for the
        accuracy's 0/1 matches and examples, exactly in float32."""
        partial = self.checkpointer.partial
        scores = {}
        for name, metric in self.state.train_scores.items():
            now = [tf.convert_to_tensor(variable) for variable in metric.variables]
            if done_steps:
                now = [kept + value for kept, value in zip(partial.scores[name], now, strict=True)]
            scores[name] = now
        return scores

    def train_one_epoch(self, epoch: int, done_steps: int = 0) -> EpochResult:
        """Train `epoch`, whose first `done_steps` steps were trained before a preemption (the
        checkpointer's partial epoch holds their losses and scores, so the epoch's metrics cover every step)."""
        state = self.state
        state.reset_metrics()
        first_step = int(state.optimizer.iterations.numpy())
        done_loss = float(self.checkpointer.partial.loss_total.numpy()) if done_steps else 0.0
        done_examples = float(self.checkpointer.partial.examples.numpy()) if done_steps else 0.0
        loop = self.passes.loop
        self.progress.start_epoch(epoch, loop.steps_per_epoch)
        started = time.perf_counter()
        try:
            self._boundaries = _StepBoundaries(self.progress, self.stopping.guard, done_steps, done_loss)
            total_loss, steps = loop.train_epoch(epoch, self._boundaries, done_steps, done_loss)
            self._boundaries = None
            train_loss = float(total_loss) / steps  # float() waits for the last step to finish
        except tf.errors.UnimplementedError as error:
            if "determinis" not in error.message:  # only op determinism's refusal is the user's to fix
                raise
            raise without_deterministic_kernel(error) from None
        except tf.errors.InvalidArgumentError as error:
            if NON_FINITE_LOSS not in str(error):
                raise
            step = int(state.optimizer.iterations.numpy()) - first_step + 1
            raise Diverged(
                f"training diverged: the loss became NaN or infinite at epoch {epoch}, step {step} of the epoch "
                f"(global step {first_step + step}); that step was not applied. The last good checkpoint is "
                f"{self.checkpointer.latest or 'none (no checkpoint was written yet)'}. Fix: lower optimizer.lr "
                "(or use lr_scaling=warmup), then re-run."
            ) from None
        train_seconds = time.perf_counter() - started
        trained = float(state.trained_examples.result())  # by this invocation
        model_metrics = {"train_loss": train_loss}
        for name, values in self._train_scores(done_steps).items():
            model_metrics[f"train_{name}"] = self._results.result(name, values)
        validate = self.passes.validate
        if validate is not None:
            model_metrics.update(validate())
        self.passes.evaluate()
        model_metrics.update(state.evaluation_results("test"))
        state.epoch.assign(epoch)
        self.checkpointer.partial.clear()
        result = EpochResult(
            epoch=epoch,
            model_metrics=model_metrics,
            examples_per_second=trained / train_seconds,
            learning_rate=current_learning_rate(state.optimizer),
            steps=steps,
            examples=int(done_examples + trained),
            train_seconds=train_seconds,
        )
        self.progress.end_epoch(result)
        return result

    def _record_partial_epoch(self) -> None:
        """Before a preemption's checkpoint: how far the epoch in progress got (nothing between epochs, where
        the partial epoch is already right: cleared at the last epoch's end, or the one this run resumed)."""
        boundaries, partial = self._boundaries, self.checkpointer.partial
        if boundaries is None:
            return
        if not self.resumes_mid_epoch:
            partial.clear()
            return
        resumed = int(partial.steps.numpy())  # non-zero: this epoch continues a preempted one
        examples = float(partial.examples.numpy()) if resumed else 0.0
        trained = tf.constant(examples, tf.float32) + tf.convert_to_tensor(self.state.trained_examples.total)
        partial.record(boundaries.steps, boundaries.total, trained, self._train_scores(resumed))

    def save_for_preemption(self) -> None:
        """The checkpoint a preemption stops with: the last epoch's counter and how far the next one got."""
        self._record_partial_epoch()
        self._save_checkpoint(int(self.state.epoch.numpy()))

    def _save_checkpoint(self, epoch: int) -> None:
        files = self.checkpointer.save()
        for listener in self.listeners:
            listener.on_checkpoint_saved(epoch, files)

    def run(self) -> list[EpochResult]:
        """Train the epochs after the one the state holds (0 for a fresh run, the restored one on resume)."""
        guard = self.stopping.guard
        with guard.watching(self.save_for_preemption, lambda: int(self.state.optimizer.iterations.numpy())):
            return self._run()

    def _run(self) -> list[EpochResult]:
        guard, history = self.stopping.guard, []
        done_steps = int(self.checkpointer.partial.steps.numpy()) if self.resumes_mid_epoch else 0
        restored_epoch = int(self.state.epoch.numpy())
        # A run restored after a listener finished it (early stopping) trains no further epoch.
        finished = any(listener.finishes for listener in _asking_to_stop(self.listeners))
        last = restored_epoch if finished else self.epochs
        try:
            for epoch in range(restored_epoch + 1, last + 1):
                guard.check()
                self.epoch = epoch
                result = self.train_one_epoch(epoch, done_steps)
                done_steps = 0
                # Metrics first, then the checkpoint: a run killed in between re-trains this epoch on
                # resume, and the tracker does not log an epoch twice.
                with guard.deferred():
                    history.append(result)
                    stop = self._after_epoch(result)
                if stop is _Stop.FINISHED:
                    break
                if stop is _Stop.LISTENER:
                    self.stopped_at = epoch
                    break
        except Preempted as stop:
            if not isinstance(stop, AgreedStop):  # which comes after its save (save_for_preemption)
                with guard.deferred():
                    self.save_for_preemption()
            raise
        guard.training_done()
        self.passes.release_iterators()
        with guard.deferred():
            for action in self.end.finished if self.stopped_at is None else self.end.stopped:
                action(history)
        return history

    def _after_epoch(self, result: EpochResult) -> _Stop | None:
        """The epoch's result to the listeners, then its checkpoint when due; whether training stops here, and
        why: a listener that stops the run (a pruned trial) wins over one that finishes it (early stopping)."""
        for listener in self.listeners:
            listener.on_epoch_end(result)
        asking = _asking_to_stop(self.listeners)
        listener_stop = any(not listener.finishes for listener in asking)
        finishes = any(listener.finishes for listener in asking)
        stopping = listener_stop or finishes
        if self.stopping.agree is not None:  # every worker, after every epoch: the chief's stop is theirs
            stopping = self.stopping.agree(stopping)
        if self.checkpointer.due(result.epoch) or stopping:  # a run stopped early keeps its last epoch
            self._save_checkpoint(result.epoch)
        if not stopping:
            return None
        # Another task's stop this task did not see itself is the chief's pruner's (early stopping agrees).
        return _Stop.FINISHED if finishes and not listener_stop else _Stop.LISTENER


def make_evaluate(
    steps: ReplicaSteps, dist_test_dataset: Iterable[Any], reaper: IteratorReaper, inline: bool = False
) -> Callable[[], None]:
    """The tutorial's test pass: a tf.function test step per distributed batch, the pass's finished iterator
    released by `reaper`. `inline`: the replica step itself over plain batches, here (ParameterServerStrategy's
    coordinator, which reads the variables from the parameter servers)."""
    test_step = tf.function(steps.test_replica_step if inline else steps.distributed_test_step)

    def evaluate() -> None:
        batches = iter(dist_test_dataset)
        for inputs in batches:
            test_step(inputs)
        reaper.release(batches)

    return evaluate


def make_validate(
    steps: ReplicaSteps,
    state: TrainingState,
    dist_validation_dataset: Iterable[Any],
    reaper: IteratorReaper,
    inline: bool = False,
) -> Callable[[], dict[str, float]]:
    """The validation split's pass, as the test pass (make_evaluate) but read at once: its val_loss and val_<score>,
    with the evaluation metrics reset for the test pass that follows."""
    evaluate = make_evaluate(steps, dist_validation_dataset, reaper, inline)

    def validate() -> dict[str, float]:
        evaluate()
        results = state.evaluation_results("val")
        for metric in state.evaluation_metrics():
            metric.reset_state()
        return results

    return validate

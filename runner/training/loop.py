"""The iteration styles: how the distributed train step is driven through one epoch.

Each style wraps the same ReplicaSteps.distributed_train_step; none re-implements the step.
`train_epoch(epoch, progress, done_steps, total)` trains an epoch whose first `done_steps` steps (summing to
the loss `total`) were trained before a preemption, and returns the sum of the epoch's per-step
(replica-summed) losses and how many steps it sums, those included. After each step (or call of steps)
it reports `progress.advance(steps, loss, total)`, total being the running sum, the state a preemption
checkpoint keeps. `make_dataset(first_epoch, epochs, skip_batches)` gives a distributed training dataset.

The running sum stays on the device (LossSum): each call of the step function adds its losses there, so a
step costs no eager op of its own, and the host reads the sum only when it needs the value.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import tensorflow as tf

from runner.training.reaper import IteratorReaper
from runner.training.steps import ReplicaSteps

MakeDataset = Callable[..., Iterable[Any]]
log = logging.getLogger("runner")


class Progress(Protocol):
    def advance(self, steps: int, loss, total) -> None: ...


class TrainingLoop(Protocol):
    """What the controller drives through each epoch, whichever style (Orbit's AbstractTrainer, for one pass)."""

    @property
    def steps_per_epoch(self) -> int: ...

    @property
    def resumes_mid_epoch(self) -> bool:
        """Whether a preempted epoch continues after its checkpointed steps on resume (False: it starts over)."""
        ...

    def train_epoch(
        self, epoch: int, progress: Progress, done_steps: int = 0, total: float = 0.0
    ) -> tuple[tf.Tensor | float, int]:
        """Train `epoch`, less its first `done_steps` steps; the sum of its steps' losses and how many it sums."""
        ...

    def finish(self) -> None:
        """After the last epoch: hand the iterators the loop still holds to its reaper."""
        ...


class LossSum:
    """The running sum of an epoch's per-step losses, a variable the step functions add to on the device.

    The additions are the ones an eager `total += loss` after each step would make, in the same order and in
    float32, so the sum is bit for bit the same; only the host's per-step eager op is gone. A plain variable,
    created outside any strategy scope: the loss it adds is already summed over the replicas."""

    def __init__(self):
        self.variable = tf.Variable(0.0, dtype=tf.float32, trainable=False, name="epoch_loss_sum")

    def start(self, total) -> tf.Variable:
        """Start an epoch from `total`, the sum of the steps trained before a preemption (0 for a fresh one)."""
        self.variable.assign(tf.constant(total, tf.float32))
        return self.variable

    def add(self, loss):
        """Inside a step function: add the step's loss; returns it."""
        self.variable.assign_add(loss)
        return loss

    def value(self) -> tf.Tensor:
        return self.variable.read_value()


def iterator_step(steps: ReplicaSteps, loss_sum: LossSum):
    """One step per call of a tf.function that takes the distributed iterator and draws the step's batch
    inside the call (as model.fit's train function does), then adds the step's loss to `loss_sum`.

    Drawing the batch in Python (`for x in dist_dataset`, `next(iterator)`) runs the distributed iterator's
    Python on every step, while the device waits; inside the function it is one op. Same batches, same order.
    At the end of the data the call raises tf.errors.OutOfRangeError, before the step touches anything."""

    @tf.function
    def train_step(iterator):
        return loss_sum.add(steps.distributed_train_step(next(iterator)))

    return train_step


class EpochDatasets:
    """The distributed dataset of one epoch, for the loops that start a pass over a dataset every epoch.

    Where the data reads its epoch from a variable when an iterator starts (`reusable`), the dataset is built and
    distributed once and each epoch sets the variable, so an epoch pays only for its iterator, as model.fit does;
    otherwise each epoch builds its own. A preempted epoch's rest, less the batches already trained, is built alone.
    Either way epoch e's batches are the same."""

    def __init__(self, make_dataset: MakeDataset, reusable: bool):
        self.make_dataset = make_dataset
        self.epoch: tf.Variable | None = None
        if reusable:
            with tf.device("/cpu:0"):  # where the input pipeline runs
                self.epoch = tf.Variable(1, dtype=tf.int64, trainable=False, name="dataset_epoch")
        self._dataset: Iterable[Any] | None = None

    def of_epoch(self, epoch: int, done_steps: int = 0) -> Iterable[Any]:
        if self.epoch is None or done_steps:
            return self.make_dataset(first_epoch=epoch, epochs=1, skip_batches=done_steps)
        if self._dataset is None:
            self._dataset = self.make_dataset(first_epoch=self.epoch, epochs=1)
        self.epoch.assign(epoch)
        return self._dataset


class ForInLoop:
    """The tutorial's epoch: one pass over the epoch's distributed dataset, one tf.function call per step,
    until the dataset ends (`for x in dist_dataset`, with the batch drawn inside the call). The finished
    epoch's iterator goes to `reaper`, whose thread waits for its release instead of the next epoch."""

    resumes_mid_epoch = True

    def __init__(self, steps: ReplicaSteps, datasets: EpochDatasets, steps_per_epoch: int, reaper: IteratorReaper):
        self.datasets = datasets
        self.reaper = reaper
        self.steps_per_epoch = steps_per_epoch
        self.loss_sum = LossSum()
        self.step = iterator_step(steps, self.loss_sum)

    def train_epoch(
        self, epoch: int, progress: Progress, done_steps: int = 0, total: float = 0.0
    ) -> tuple[tf.Tensor | float, int]:
        total, count = self.loss_sum.start(total), done_steps
        batches = iter(self.datasets.of_epoch(epoch, done_steps))
        while True:
            try:
                loss = self.step(batches)
            except tf.errors.OutOfRangeError:  # the epoch's dataset has ended
                break
            count += 1
            progress.advance(1, loss, total)
        self.reaper.release(batches)
        return self.loss_sum.value(), count

    def finish(self) -> None:
        """Nothing is held: each epoch's iterator went to the reaper when the epoch ended."""


class InFunctionLoop:
    """The whole epoch inside one tf.function: AutoGraph turns `for x in <the epoch's distributed iterator>`
    into a loop. The iterator starts outside the function, so that its release goes to `reaper` (one started
    inside would be released inside, and the call would wait for it)."""

    resumes_mid_epoch = True

    def __init__(self, steps: ReplicaSteps, datasets: EpochDatasets, steps_per_epoch: int, reaper: IteratorReaper):
        self.datasets = datasets
        self.steps_per_epoch = steps_per_epoch
        self.reaper = reaper
        step = steps.distributed_train_step

        @tf.function
        def train_whole_epoch(batches, total):
            count = tf.constant(0)
            for inputs in batches:
                total += step(inputs)
                count += 1
            return total, count

        self.train_whole_epoch = train_whole_epoch

    def train_epoch(
        self, epoch: int, progress: Progress, done_steps: int = 0, total: float = 0.0
    ) -> tuple[tf.Tensor | float, int]:
        started = tf.constant(total, tf.float32)
        batches = iter(self.datasets.of_epoch(epoch, done_steps))
        total, count = self.train_whole_epoch(batches, started)
        self.reaper.release(batches)
        count = int(count)
        progress.advance(count, (total - started) / max(count, 1), total)
        return total, done_steps + count

    def finish(self) -> None:
        """Nothing is held: each epoch's iterator went to the reaper when the epoch ended."""


class IteratorLoop:
    """`steps_per_epoch` steps per epoch, one call each, from one endless dataset and iterator per run.

    A run resumed after `done_epochs` and `done_steps` steps of the next epoch skips the batches they
    consumed, so it continues exactly where an uninterrupted run would be. `finish()`, after the last epoch,
    hands the run's iterator to `reaper` (releasing a long-lived one waits longest: 16 s measured).
    """

    resumes_mid_epoch = True

    def __init__(
        self,
        steps: ReplicaSteps,
        make_dataset: MakeDataset,
        steps_per_epoch: int,
        reaper: IteratorReaper,
        done_epochs: int = 0,
        done_steps: int = 0,
    ):
        self.dataset = make_dataset(first_epoch=1, epochs=None, skip_batches=done_epochs * steps_per_epoch + done_steps)
        self.steps_per_epoch = steps_per_epoch
        self.reaper = reaper
        self.loss_sum = LossSum()
        self.step = iterator_step(steps, self.loss_sum)
        self._iterator: Iterator[Any] | None = None

    @property
    def iterator(self):
        if self._iterator is None:
            self._iterator = iter(self.dataset)
        return self._iterator

    def finish(self) -> None:
        if self._iterator is not None:
            self.reaper.release(self._iterator)
            self._iterator = None

    def train_epoch(
        self, epoch: int, progress: Progress, done_steps: int = 0, total: float = 0.0
    ) -> tuple[tf.Tensor | float, int]:
        total = self.loss_sum.start(total)
        for _ in range(done_steps, self.steps_per_epoch):
            loss = self.step(self.iterator)
            progress.advance(1, loss, total)
        return self.loss_sum.value(), self.steps_per_epoch


class MultiStepLoop(IteratorLoop):
    """`steps_per_call` steps per tf.function call, a tf.while_loop over the iterator (Model Garden's
    steps_per_loop): Python and dispatch overhead is paid once per call instead of once per step."""

    def __init__(
        self,
        steps: ReplicaSteps,
        make_dataset: MakeDataset,
        steps_per_epoch: int,
        reaper: IteratorReaper,
        done_epochs: int,
        steps_per_call: int,
        done_steps: int = 0,
    ):
        super().__init__(steps, make_dataset, steps_per_epoch, reaper, done_epochs, done_steps)
        self.steps_per_call = steps_per_call
        step = steps.distributed_train_step

        loss_sum = self.loss_sum

        @tf.function
        def train_steps(iterator, count):
            """`count` steps: the sum of their losses joins the epoch's (one addition per call); returns their mean."""
            total = tf.constant(0.0)
            for _ in tf.range(count):
                total += step(next(iterator))
            loss_sum.add(total)
            return total / tf.cast(count, tf.float32)

        self.train_steps = train_steps

    def train_epoch(
        self, epoch: int, progress: Progress, done_steps: int = 0, total: float = 0.0
    ) -> tuple[tf.Tensor | float, int]:
        # A preemption stops between calls, so a resumed epoch's calls cover the same steps as an uninterrupted one's.
        total, done = self.loss_sum.start(total), done_steps
        while done < self.steps_per_epoch:
            count = min(self.steps_per_call, self.steps_per_epoch - done)
            mean = self.train_steps(self.iterator, tf.constant(count))
            done += count
            progress.advance(count, mean, total)
        return self.loss_sum.value(), done


class CoordinatorLoop:
    """ParameterServerStrategy: the coordinator schedules each step on whichever worker is free
    (ClusterCoordinator.schedule), every worker reading its own endless dataset, and joins once per
    epoch of `steps_per_epoch` steps. Variables live on the parameter servers; updates are asynchronous.

    A preempted epoch starts over on resume (steps already scheduled may still be running when the
    checkpoint is saved): `done_steps` is always 0 here."""

    resumes_mid_epoch = False

    def __init__(
        self,
        steps: ReplicaSteps,
        coordinator: tf.distribute.coordinator.ClusterCoordinator,
        dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
        steps_per_epoch: int,
    ):
        self.coordinator = coordinator
        self.steps_per_epoch = steps_per_epoch
        strategy = steps.strategy
        per_worker = coordinator.create_per_worker_dataset(
            lambda: strategy.distribute_datasets_from_function(dataset_fn)
        )
        self.iterator = iter(per_worker)
        step = steps.distributed_train_step

        @tf.function
        def train_step(iterator):
            return step(next(iterator))

        self.train_step = train_step

    def train_epoch(
        self, epoch: int, progress: Progress, done_steps: int = 0, total: float = 0.0
    ) -> tuple[tf.Tensor | float, int]:
        losses = [
            self.coordinator.schedule(self.train_step, args=(self.iterator,)) for _ in range(self.steps_per_epoch)
        ]
        total, read, value = 0.0, 0, 0.0
        for loss in losses:  # scheduling order, roughly the order the workers finish them in
            try:
                value = float(loss.fetch())
                total += value
                read += 1
            except (tf.errors.UnavailableError, tf.errors.AbortedError) as error:
                # TensorFlow re-runs a step whose worker died, but not the reading of a finished step's
                # result, which stays on its worker: the step counts (its update is on the parameter
                # servers), its loss is gone. A parameter server's failure is the job's.
                if "/job:ps" in str(error):
                    raise
            progress.advance(1, value, total)
        self.coordinator.join()
        if read < len(losses):
            log.warning(
                "epoch %d: the losses of %d steps were lost with a worker that died before they were read; "
                "train_loss is the mean of the other %d",
                epoch,
                len(losses) - read,
                read,
            )
        return (total if read else float("nan")), max(read, 1)

    def finish(self) -> None:
        """Nothing to hand over: the workers' iterators belong to the coordinator."""


def make_loop(
    style: str,
    steps: ReplicaSteps,
    make_dataset: MakeDataset,
    steps_per_epoch: int,
    steps_per_call: int,
    done_epochs: int = 0,
    done_steps: int = 0,
    *,
    reaper: IteratorReaper,
    epoch_read_when_iterated: bool = False,
) -> TrainingLoop:
    """The loop for `style`, ready to train epoch done_epochs + 1 onwards, whose first `done_steps` steps
    were trained before a preemption. `epoch_read_when_iterated`: make_dataset(first_epoch=<a tf.Variable>)
    reads the epoch when an iterator starts (EpochDatasets). `reaper` releases a pass's finished iterator."""
    if style == "for_in":
        return ForInLoop(steps, EpochDatasets(make_dataset, epoch_read_when_iterated), steps_per_epoch, reaper)
    if style == "iterator":
        return IteratorLoop(steps, make_dataset, steps_per_epoch, reaper, done_epochs, done_steps)
    if style == "in_function":
        return InFunctionLoop(steps, EpochDatasets(make_dataset, epoch_read_when_iterated), steps_per_epoch, reaper)
    if style == "multi_step":
        return MultiStepLoop(steps, make_dataset, steps_per_epoch, reaper, done_epochs, steps_per_call, done_steps)
    raise ValueError(f"unknown loop style {style!r}")

"""Checkpoints through tf.train.Checkpoint/CheckpointManager, and the tutorial's last section:
restore the latest checkpoint into a fresh model without a strategy and evaluate it."""

from __future__ import annotations

import glob
import logging
import os
import re
import tempfile
from collections.abc import Mapping
from typing import Any

import tensorflow as tf
from google.protobuf import text_format

from runner.compat.tf_internals import CheckpointState
from runner.config.schema import CheckpointSettings
from runner.errors import RunnerError
from runner.training.steps import TrainingState

log = logging.getLogger("runner")


class PartialEpoch(tf.Module):
    """How far the epoch after the checkpoint's epoch counter had got when the checkpoint was saved: written
    by a preemption mid-epoch (zero at an epoch's end), so that a resume continues at the next batch and the
    epoch's train_loss and each train_<score> still cover all of its steps.

    Plain variables, created outside any strategy scope: the values are the job's (summed over replicas and
    workers), the same in every process, whatever the strategy. `scores`: each training score's state (the values
    of its Keras metric's variables), by name.
    """

    def __init__(self, scores: Mapping[str, Any] | None = None):
        super().__init__(name="partial_epoch")
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")  # steps of the epoch trained
        self.loss_total = tf.Variable(0.0, dtype=tf.float32, trainable=False, name="loss_total")  # their losses' sum
        self.examples = tf.Variable(0.0, dtype=tf.float32, trainable=False, name="examples")  # examples trained
        self.scores = {
            name: [
                tf.Variable(tf.zeros(variable.shape, variable.dtype), trainable=False, name=f"{name}_{index}")
                for index, variable in enumerate(metric.variables)
            ]
            for name, metric in (scores or {}).items()
        }

    def record(self, steps: int, loss_total, examples, scores: Mapping[str, list[Any]]) -> None:
        self.steps.assign(steps)
        self.loss_total.assign(loss_total)
        self.examples.assign(examples)
        for name, values in scores.items():
            for variable, value in zip(self.scores[name], values, strict=True):
                variable.assign(value)

    def clear(self) -> None:
        zeros = {name: [tf.zeros_like(variable) for variable in kept] for name, kept in self.scores.items()}
        self.record(0, 0.0, 0.0, zeros)


class Checkpointer:
    """Checkpoints named by global step (ckpt-<optimizer.iterations>), each holding the epoch counter.

    Resuming never trusts a file it has not read: see restore().
    """

    def __init__(
        self,
        directory: str,
        state: TrainingState,
        settings: CheckpointSettings,
        epochs: int,
        scratch: bool = False,
        extra: Mapping[str, Any] | None = None,
    ):
        self.directory = directory
        # A MultiWorkerMirrored worker other than the chief must take part in every save, but only the
        # chief's checkpoint is kept: a scratch checkpointer writes into a temporary directory removed
        # right after, and reads (resumes) from the chief's `directory`, which it never writes.
        self.scratch = scratch
        self.state = state
        self.every_epochs = settings.every_epochs
        self.epochs = epochs
        self.partial = PartialEpoch(state.train_scores)
        # `extra`: more of the run's state to keep with each checkpoint (early stopping's, under its name).
        parts = {"model": state.model, "optimizer": state.optimizer, "epoch": state.epoch, **(extra or {})}
        self.checkpoint = tf.train.Checkpoint(**parts, partial_epoch=self.partial)
        # Checkpoints written before partial epochs were kept: restored without one (the epoch starts over).
        self._without_partial = tf.train.Checkpoint(**parts)
        self.listed = listed_checkpoints(directory, repair=not scratch)
        self.manager = (
            None
            if scratch
            else tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=settings.max_to_keep)
        )
        self._good: str | None = None  # the checkpoint this process restored or saved: known readable

    def due(self, epoch: int) -> bool:
        """Every `every_epochs` epochs, and always after the last one so the final model is kept."""
        return epoch % self.every_epochs == 0 or epoch == self.epochs

    def save(self) -> list[str]:
        """Save (unless this process already holds a good checkpoint of this very step) and return the
        checkpoint's files. A step whose checkpoint on disk was skipped as unreadable is written anew."""
        step = int(self.state.optimizer.iterations.numpy())
        if self.scratch:
            with tempfile.TemporaryDirectory(prefix="runner-ckpt-") as scratch:
                tf.train.CheckpointManager(self.checkpoint, scratch, max_to_keep=1).save(checkpoint_number=step)
            return []
        assert self.manager is not None  # every checkpointer but a scratch one has a manager
        if self._good is None or _step(self._good) != step:
            self._good = self.manager.save(checkpoint_number=step)
        return self.files(self._good)

    def files(self, prefix: str) -> list[str]:
        """A checkpoint's files (its data and index, and the directory's `checkpoint` list), as save() returns them."""
        return sorted(glob.glob(prefix + ".*")) + [os.path.join(self.directory, "checkpoint")]

    @property
    def latest(self) -> str | None:
        """The newest checkpoint known to be readable: restored or saved by this process."""
        return self._good

    @property
    def exists(self) -> bool:
        """Whether the directory lists any checkpoint, readable or not."""
        return bool(self.listed)

    def restore(self) -> int:
        """Restore the newest readable checkpoint; return its epoch (0 when there is none). A checkpoint saved
        mid-epoch also restores `partial` (the steps of the next epoch already trained).

        A checkpoint is restored only after every tensor in it has been read back in full
        (runner.training.checkpoints.unreadable): whatever reading raises (a data file cut short, a
        cut or empty index, a missing data file) skips that checkpoint for the one before with one
        warning, and the state's variables are untouched by it, so no variable is ever half restored
        from a damaged file. A checkpoint that reads fine but does not fit the model is refused.
        """
        for path in reversed(self.listed):
            reason = unreadable(path)
            if reason:
                log.warning("checkpoint %s is unreadable (%s): skipped for the one before", path, reason)
                continue
            names = tf.train.load_checkpoint(path).get_variable_to_shape_map()
            # A checkpoint of an older runner kept no score's state: its partial epoch starts over.
            kept = {name.split("/")[2] for name in names if name.startswith("partial_epoch/scores/")}
            has_partial = any(name.startswith("partial_epoch/") for name in names) and kept >= set(self.partial.scores)
            self.partial.clear()
            try:
                (self.checkpoint if has_partial else self._without_partial).restore(
                    path
                ).assert_existing_objects_matched()
            except (ValueError, AssertionError) as error:
                raise RunnerError(
                    f"the checkpoint {path} does not fit this model ({str(error).splitlines()[0][:300]}): it "
                    "was written by a run with another model or configuration. Fix: pick a new hydra.run.dir "
                    "for this configuration, or re-run with the overrides that wrote that directory."
                ) from None
            self._good = path
            return int(self.state.epoch.numpy())
        if self.listed:
            log.warning("no checkpoint in %s is readable: starting over from epoch 1 in the same run", self.directory)
        return 0


def unreadable(path: str) -> str | None:
    """Why the checkpoint `path` (a prefix such as .../ckpt-96) cannot be read in full, or None if it can.

    Reads the index and every tensor of every data shard, one at a time, without touching any model:
    TensorFlow raises IndexError, DataLossError, NotFoundError, OutOfRangeError and others for the
    various ways a file can be cut or lost, so any exception counts."""
    try:
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception as error:  # noqa: BLE001 (every way of failing to read means the same here)
        words = " ".join(str(getattr(error, "message", error)).split())
        return f"{type(error).__name__}: {words[:200]}" if words else type(error).__name__
    return None


def _step(path: str) -> int:
    """The global step in a checkpoint prefix's name (ckpt-<step>), -1 for any other name."""
    match = re.fullmatch(r"ckpt-(\d+)", os.path.basename(path))
    return int(match.group(1)) if match else -1


def listed_checkpoints(directory: str, repair: bool = False) -> list[str]:
    """The checkpoints of `directory`, oldest first, as TensorFlow's `checkpoint` state file lists them.

    A state file that cannot be read (empty, garbled, or missing beside ckpt-*.index files) gives way
    to the ckpt-*.index files on disk, ordered by step number (never by name: ckpt-128 is newer than
    ckpt-64); with `repair`, the state file is rewritten from that list, since tf.train.CheckpointManager
    reads it on construction and fails on an empty one or forgets every checkpoint of a garbled one.
    """
    state_file = os.path.join(directory, "checkpoint")
    on_disk = sorted((path[: -len(".index")] for path in glob.glob(os.path.join(directory, "ckpt-*.index"))), key=_step)
    try:
        state = _read_state(state_file)
    except (OSError, ValueError, text_format.ParseError) as error:
        if not on_disk and not os.path.exists(state_file):
            return []
        problem = "is missing" if not os.path.exists(state_file) else f"is unreadable ({type(error).__name__})"
        log.warning(
            "checkpoint state file %s %s: using the %d ckpt-*.index file(s) found beside it instead",
            state_file,
            problem,
            len(on_disk),
        )
        if repair and on_disk:
            _write_state(state_file, on_disk)
        elif repair and os.path.exists(state_file):
            os.remove(state_file)  # nothing to list: TensorFlow starts a fresh one with the first save
        return on_disk
    paths = [
        path if os.path.isabs(path) else os.path.join(directory, path) for path in state.all_model_checkpoint_paths
    ]
    return paths or [os.path.join(directory, state.model_checkpoint_path)]


def _write_state(state_file: str, paths: list[str]) -> None:
    """Write the state file listing `paths` (newest last), as CheckpointManager would: relative names,
    replaced in one rename so that a reader sees the old file or the new one."""
    names = [os.path.basename(path) for path in paths]
    state = CheckpointState(model_checkpoint_path=names[-1], all_model_checkpoint_paths=names)
    with open(state_file + ".tmp", "w") as handle:
        handle.write(text_format.MessageToString(state))
    os.replace(state_file + ".tmp", state_file)


def _read_state(state_file: str):
    """The parsed state file; raises OSError (missing), ValueError or ParseError (empty, garbled)."""
    with open(state_file, "rb") as handle:
        text = handle.read().decode("utf-8")  # UnicodeDecodeError is a ValueError
    state = CheckpointState()
    text_format.Parse(text, state)
    if not state.model_checkpoint_path:
        raise ValueError("no model_checkpoint_path")
    return state


def restore_without_strategy(checkpoint_path: str, build_model) -> tf.keras.Model:
    """The checkpointed model, restored into a fresh model outside any strategy (what gets evaluated and
    exported, whichever strategy trained it)."""
    with tf.distribute.get_strategy().scope():  # the default strategy, whatever the run used
        model = build_model()
        tf.train.Checkpoint(model=model).restore(checkpoint_path).expect_partial()
    return model


def evaluate_scores(
    model: tf.keras.Model, test_dataset: tf.data.Dataset, scores: Mapping[str, Any], scored=None
) -> dict[str, float]:
    """Each of `scores` (new Keras metrics, by name) of `model`, outside any strategy, on the test batches, updated
    with `scored(outputs)` (the task's: runner.training.task.Experiment.scored; None: the outputs)."""

    @tf.function
    def eval_step(images, labels):
        outputs = model(images, training=False)
        if scored is not None:
            outputs = scored(outputs)
        for metric in scores.values():
            metric.update_state(labels, outputs)

    for images, labels in test_dataset:
        eval_step(images, labels)
    return {name: float(metric.result()) for name, metric in scores.items()}


def evaluate_without_strategy(
    checkpoint_path: str, build_model, test_dataset: tf.data.Dataset, scores: Mapping[str, Any], scored=None
) -> dict[str, float]:
    """`scores` (new Keras metrics, by name) of the checkpointed model, restored into a fresh model outside any
    strategy."""
    return evaluate_scores(restore_without_strategy(checkpoint_path, build_model), test_dataset, scores, scored)

"""Resuming from damaged checkpoint directories, in this process: each way a checkpoint's files can be cut,
emptied, lost or garbled skips to the newest readable checkpoint (by step number) and never leaves a
variable half restored. The same damages end to end, through `python -m runner`: test_resilience.py.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from runner.builtins import keras_lane
from runner.builtins.models import cnn
from runner.builtins.optimizers import adam
from runner.config.schema import CheckpointSettings
from runner.training.checkpoints import Checkpointer
from runner.training.optimizer import prepare_optimizer
from runner.training.steps import TrainingState

# Step numbers whose names sort differently as strings: "ckpt-128" < "ckpt-32" < "ckpt-64".
STEPS = {1: 32, 2: 64, 3: 128}


def _state(keras: int = 2) -> TrainingState:
    """The CNN and its Adam in Keras `keras` (2: tf_keras, 3: Keras 3), seeded alike."""
    keras_lane.prepare("float32", 5, keras)
    return TrainingState.create(
        lambda: cnn((28, 28, 1), 10, weight_decay=0.0), lambda variables: prepare_optimizer(adam(1e-3), variables)
    )


def _checkpointer(directory: Path, state: TrainingState) -> Checkpointer:
    return Checkpointer(str(directory), state, CheckpointSettings(every_epochs=1, max_to_keep=5), epochs=3)


def _weights(state: TrainingState) -> list[np.ndarray]:
    optimizer = state.optimizer.variables  # a method in tf_keras, a list in Keras 3
    variables = optimizer() if callable(optimizer) else optimizer
    return [np.asarray(variable.numpy()) for variable in (*state.model.variables, *variables)]


def _save_three(directory: Path, keras: int = 2) -> dict[int, list[np.ndarray]]:
    """Three checkpoints of different weights in `directory`; each checkpoint's weights (0: the initial ones)."""
    state = _state(keras)
    checkpointer = _checkpointer(directory, state)
    weights = {0: _weights(_state(keras))}
    for epoch, step in STEPS.items():
        for variable in state.model.trainable_variables:
            variable.assign(variable.numpy() + epoch)
        state.optimizer.iterations.assign(step)
        state.epoch.assign(epoch)
        checkpointer.save()
        weights[epoch] = _weights(state)
    return weights


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A directory with three checkpoints of different weights, and each checkpoint's weights."""
    directory = tmp_path_factory.mktemp("saved") / "checkpoints"
    return directory, _save_three(directory)


def _files(directory: Path, epoch: int) -> tuple[Path, Path]:
    prefix = directory / f"ckpt-{STEPS[epoch]}"
    return prefix.with_name(prefix.name + ".data-00000-of-00001"), prefix.with_name(prefix.name + ".index")


def _cut(path: Path, size) -> None:
    content = path.read_bytes()
    path.write_bytes(content[: size(len(content))])


def _data(epoch: int, size):
    return lambda directory: _cut(_files(directory, epoch)[0], size)


def _index(epoch: int, size):
    return lambda directory: _cut(_files(directory, epoch)[1], size)


def _every_data_file(directory: Path) -> None:
    for epoch in STEPS:
        _cut(_files(directory, epoch)[0], lambda n: n // 2)


# damage -> (the epoch restored, the file named in the one warning line)
DAMAGES = {
    "newest data file cut to 0 bytes": (_data(3, lambda n: 0), 2, "ckpt-128"),
    "newest data file cut to 100 bytes": (_data(3, lambda n: 100), 2, "ckpt-128"),
    "newest data file cut to half": (_data(3, lambda n: n // 2), 2, "ckpt-128"),
    "newest index cut to half": (_index(3, lambda n: n // 2), 2, "ckpt-128"),
    "newest index empty": (_index(3, lambda n: 0), 2, "ckpt-128"),
    "newest data file missing": (lambda d: _files(d, 3)[0].unlink(), 2, "ckpt-128"),
    "state file empty": (lambda d: (d / "checkpoint").write_text(""), 3, "checkpoint state file"),
    "state file garbled": (
        lambda d: (d / "checkpoint").write_bytes(b"model_checkpoint_path: \xff{{"),
        3,
        "checkpoint state file",
    ),
    "state file missing": (lambda d: (d / "checkpoint").unlink(), 3, "checkpoint state file"),
    "every data file cut": (_every_data_file, 0, "ckpt-32"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_checkpoint_falls_back_to_the_newest_readable_one(saved, tmp_path, caplog, damage):
    source, weights = saved
    directory = tmp_path / "checkpoints"
    shutil.copytree(source, directory)
    harm, epoch, named = DAMAGES[damage]
    harm(directory)
    state = _state()
    with caplog.at_level(logging.WARNING, logger="runner"):
        restored = _checkpointer(directory, state).restore()
    assert restored == epoch == int(state.epoch.numpy())
    # Every variable holds the fallback's values, or its initial ones: nothing from the damaged file.
    for ours, expected in zip(_weights(state), weights[epoch], strict=True):
        np.testing.assert_array_equal(ours, expected)
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any(named in line for line in warnings), warnings
    if epoch:
        assert len(warnings) == 1, warnings
    else:
        assert len(warnings) == len(STEPS) + 1 and "starting over" in warnings[-1], warnings


def test_training_on_after_a_skipped_checkpoint_writes_that_step_anew(saved, tmp_path):
    source, _ = saved
    directory = tmp_path / "checkpoints"
    shutil.copytree(source, directory)
    _data(3, lambda n: 100)(directory)
    state = _state()
    checkpointer = _checkpointer(directory, state)
    assert checkpointer.restore() == 2 and checkpointer.latest.endswith("ckpt-64")
    state.optimizer.iterations.assign(STEPS[3])
    state.epoch.assign(3)
    files = checkpointer.save()
    assert checkpointer.latest.endswith("ckpt-128") and str(_files(directory, 3)[0]) in files
    assert _checkpointer(directory, _state()).restore() == 3


@pytest.mark.parametrize("damage", ["newest data file cut to half", "every data file cut"])
def test_a_keras3_models_damaged_checkpoint_falls_back_as_a_tf_keras_ones_does(tmp_path, caplog, damage):
    """Keras 3's variables are not tf.Variables: the fallback still restores all of them from the newest readable
    checkpoint, or leaves all of them initial."""
    try:
        directory = tmp_path / "checkpoints"
        weights = _save_three(directory, keras=3)
        harm, epoch, named = DAMAGES[damage]
        harm(directory)
        state = _state(keras=3)
        assert type(state.model).__module__.startswith("keras.")
        with caplog.at_level(logging.WARNING, logger="runner"):
            restored = _checkpointer(directory, state).restore()
        assert restored == epoch == int(state.epoch.numpy())
        for ours, expected in zip(_weights(state), weights[epoch], strict=True):
            np.testing.assert_array_equal(ours, expected)
        assert any(named in record.getMessage() for record in caplog.records)
    finally:
        keras_lane.select(2)  # this process's other tests build tf_keras models

"""The validation split (dataset.validation_fraction): held out of the training examples (whole files, for file
data), stratified by label, drawn from the split seed alone, evaluated every epoch and logged as a dataset input
with context `validation`; what the runner cannot split is one paragraph."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.config import dataset_settings
from helpers.data import SHAPE, origin, tfrecord_data, write_image_folder, write_npz, write_tfrecords
from helpers.tracking import metric_history, mlflow_client
from runner.data.loading import load_data
from runner.data.validation import OPTIONAL_VARIABLE
from runner.errors import RunnerError


def _npz(tmp_path, **keys):
    path = tmp_path / "data.npz"
    if not path.exists():
        write_npz(path, train=203, test=20)
    return dataset_settings("npz", path=str(path), **keys)


def test_the_split_is_disjoint_stratified_and_the_same_for_every_run_seed_given_the_split_seed(tmp_path):
    whole = load_data(_npz(tmp_path), seed=1)
    data = load_data(_npz(tmp_path, validation_fraction=0.25, split_seed=5), seed=1)
    training = np.setdiff1d(np.arange(whole.train_examples), data.validation_indices)
    # Disjoint and complete: the held-out examples are exactly those missing from training, in their order.
    assert len(data.validation_indices) + data.train_examples == whole.train_examples
    np.testing.assert_array_equal(data.train_images, whole.train_images[training])
    np.testing.assert_array_equal(data.validation_images, whole.train_images[data.validation_indices])
    np.testing.assert_array_equal(data.validation_labels, whole.train_labels[data.validation_indices])
    np.testing.assert_array_equal(data.test_images, whole.test_images)  # the test set is untouched
    # Stratified: each label's share held out is within one example of the fraction.
    for label in np.unique(whole.train_labels):
        members = int(np.sum(whole.train_labels == label))
        assert abs(int(np.sum(data.validation_labels == label)) - 0.25 * members) <= 1
    # Fixed by the split seed, whatever the run's seed (a sweep's seed replicates); a new split seed, a new split.
    other_seed = load_data(_npz(tmp_path, validation_fraction=0.25, split_seed=5), seed=2)
    np.testing.assert_array_equal(other_seed.validation_indices, data.validation_indices)
    reshuffled = load_data(_npz(tmp_path, validation_fraction=0.25, split_seed=6), seed=1)
    assert not np.array_equal(reshuffled.validation_indices, data.validation_indices)
    # Without a split seed the run's seed draws it.
    by_run_seed = load_data(_npz(tmp_path, validation_fraction=0.25), seed=5)
    np.testing.assert_array_equal(by_run_seed.validation_indices, data.validation_indices)
    contexts = {item["context"]: item for item in data.inputs()}
    assert contexts.keys() == {"training", "evaluation", "validation"}
    assert contexts["validation"]["features"]["shape"][0] == len(data.validation_indices)
    assert {item["context"] for item in whole.inputs()} == {"training", "evaluation"}
    assert whole.validation_dataset(8) is None


def test_file_data_is_split_by_whole_files_and_refused_when_a_split_would_be_empty(tmp_path):
    write_tfrecords(tmp_path, "train", files=4, per_file=10)
    write_tfrecords(tmp_path, "test", files=1, per_file=4)
    data = tfrecord_data(tmp_path, validation_fraction=0.25, split_seed=0)
    assert data.train_examples == 30 and len(data.train_files) == 3
    held = {file for file, _ in (example for batch, _ in data.validation_dataset(64) for example in origin(batch))}
    trained = {file for file, _ in (example for batch, _ in data.train_dataset(64, 0) for example in origin(batch))}
    assert len(held) == 1 and len(trained) == 3 and not held & trained
    assert sum(len(labels) for _, labels in data.validation_dataset(4)) == 10
    assert {item["context"] for item in data.inputs()} == {"training", "evaluation", "validation"}
    with pytest.raises(RunnerError) as raised:
        tfrecord_data(tmp_path, validation_fraction=0.1)  # 0.4 of a file rounds to none
    message = str(raised.value)
    assert message.startswith("dataset.validation_fraction=0.1 is not valid") and "4 files" in message
    assert "validation split with none" in message and "Fix:" in message and "\n" not in message
    one = tmp_path / "one"
    one.mkdir()
    write_tfrecords(one, "train", files=1, per_file=10)
    write_tfrecords(one, "test", files=1, per_file=4)
    with pytest.raises(RunnerError, match=r"^dataset.validation_fraction=0.5 is not valid .* 1 file, .*Fix:"):
        tfrecord_data(one, validation_fraction=0.5)


def test_a_stream_is_refused_unless_it_brings_its_own_validation_split(monkeypatch):
    target = ["_target_=helpers.data.stream_with_validation", "name=stream"]
    keys = dict(item.split("=") for item in target)
    own = load_data(dataset_settings("synthetic", **keys, validation_fraction=0.1, with_validation=True), seed=0)
    assert sum(len(labels) for _, labels in own.validation_dataset(5)) == 12
    assert own.validation.examples == 12 and own.train_examples == 48
    plain = dataset_settings("synthetic", **keys, validation_fraction=0.1, with_validation=False)
    with pytest.raises(RunnerError) as raised:
        load_data(plain, seed=0)
    message = str(raised.value)
    assert message.startswith("dataset.validation_fraction=0.1 is not valid for dataset._target_=")
    assert "cannot split" in message and "validation=" in message and "\n" not in message
    # A sweep's default fraction over such data trains without a validation split (the sweep says it chose on test).
    monkeypatch.setenv(OPTIONAL_VARIABLE, "1")
    assert load_data(plain, seed=0).validation_dataset(5) is None
    assert SHAPE == own.spec.raw_shape


def test_every_epoch_logs_val_loss_and_val_accuracy_and_the_split_is_a_validation_input(train, tracking_uri):
    result = train("epochs=2", "dataset.validation_fraction=0.2", "strategy=one_device")
    client = mlflow_client(tracking_uri)
    for key in ("val_loss", "val_accuracy"):
        assert [step for step, _ in metric_history(client, result.run_id, key)] == [1, 2]
    accuracies = [value for _, value in metric_history(client, result.run_id, "val_accuracy")]
    assert all(0.0 <= value <= 1.0 for value in accuracies) and accuracies[-1] > 0.2  # it learns: 10 classes
    assert [epoch["val_accuracy"] for epoch in result.history] == accuracies
    inputs = client.get_run(result.run_id).inputs.dataset_inputs
    contexts = {tag.value for item in inputs for tag in item.tags if tag.key == "mlflow.data.context"}
    assert contexts == {"training", "evaluation", "validation"}
    # 512 training examples less a fifth, each of the 10 labels' share rounded to a whole example.
    assert abs(result.history[0].examples - 0.8 * 512) <= 5


# ---- k-fold cross-validation (sweep.folds sets dataset.folds and dataset.fold for each run) ----------------


def test_the_folds_partition_the_training_examples_stratified_and_fixed_by_the_split_seed(tmp_path):
    whole = load_data(_npz(tmp_path), seed=0)
    folds = [load_data(_npz(tmp_path, folds=3, fold=fold, split_seed=9), seed=fold) for fold in range(3)]
    held = [data.validation_indices for data in folds]
    np.testing.assert_array_equal(np.sort(np.concatenate(held)), np.arange(whole.train_examples))
    assert max(map(len, held)) - min(map(len, held)) <= 1
    for data in folds:
        assert data.train_examples + len(data.validation_indices) == whole.train_examples
        np.testing.assert_array_equal(data.validation_labels, whole.train_labels[data.validation_indices])
        assert data.validation_split() == {"examples": data.validation_indices.tolist()}
        for label in np.unique(whole.train_labels):
            members = int(np.sum(whole.train_labels == label))
            assert abs(int(np.sum(data.validation_labels == label)) - members / 3) <= 1
    again = load_data(_npz(tmp_path, folds=3, fold=1, split_seed=9), seed=5)
    np.testing.assert_array_equal(again.validation_indices, held[1])
    with pytest.raises(RunnerError, match=r"^dataset.validation_fraction=0.1 is not valid with dataset.folds=3 .*Fix:"):
        load_data(_npz(tmp_path, folds=3, validation_fraction=0.1), seed=0)
    with pytest.raises(RunnerError, match=r"^dataset.fold=3 is not valid: dataset.folds=3 has folds 0 to 2\. Fix:"):
        load_data(_npz(tmp_path, folds=3, fold=3), seed=0)


def test_file_data_folds_by_whole_files_and_too_few_files_or_a_stream_is_one_paragraph(tmp_path):
    write_tfrecords(tmp_path, "train", files=3, per_file=10)
    write_tfrecords(tmp_path, "test", files=1, per_file=4)
    data = tfrecord_data(tmp_path, folds=3, fold=2, split_seed=0)
    assert len(data.train_files) == 2 and len(data.validation_split()["files"]) == 1
    assert not set(data.train_files) & set(data.validation_split()["files"]) and data.train_examples == 20
    with pytest.raises(RunnerError) as raised:
        tfrecord_data(tmp_path, folds=5)
    message = str(raised.value)
    assert message.startswith("dataset.folds=5 (sweep.folds) is not valid for dataset._target_=")
    assert "3 files" in message and "Fix: use sweep.folds=3 or fewer" in message and "\n" not in message
    stream = dataset_settings("synthetic", _target_="helpers.data.stream_with_validation", name="stream", folds=2)
    with pytest.raises(RunnerError, match=r"^dataset.folds=2 \(sweep.folds\) is not valid .* cannot split into folds"):
        load_data(stream, seed=0)


def test_an_image_folder_is_split_by_whole_files_stratified_by_class(tmp_path):
    write_image_folder(tmp_path / "images", per_class=4, classes=("cat", "dog"))
    data = load_data(dataset_settings("image_folder", dir=tmp_path / "images", validation_fraction=0.25), seed=0)
    held = data.validation_split()["files"]
    assert sorted(file.split("/")[-2] for file in held) == ["cat", "dog"]  # one of each class's four files
    assert data.train_examples == 6 and not set(held) & set(data.train_files)
    assert sorted(int(label) for _, labels in data.validation_dataset(8) for label in labels) == [0, 1]

"""The IDX reader and loaders, on small IDX files the tests write themselves."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from helpers.config import dataset_settings
from helpers.data import write_fashion_mnist, write_idx
from runner.data.idx import read_idx
from runner.data.in_memory import batches_per_epoch
from runner.data.loading import load_data
from runner.errors import RunnerError
from runner.training.loop import EpochDatasets


def _settings(name: str = "fashion_mnist", **keys):
    return dataset_settings(name, **keys)


@pytest.mark.parametrize("compress", [True, False])
def test_read_idx_round_trips_shape_and_values(tmp_path, compress):
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / ("x.idx" + (".gz" if compress else ""))
    write_idx(path, array, compress)
    np.testing.assert_array_equal(read_idx(str(path)), array)


def test_an_idx_file_is_decoded_once_until_it_changes(tmp_path):
    """A warm sweep worker's runs share the decoded file; a file written anew is read anew."""
    path = tmp_path / "x.idx.gz"
    write_idx(path, np.zeros((2, 3), dtype=np.uint8), True)
    first = read_idx(str(path))
    assert read_idx(str(path)) is first and not first.flags.writeable
    write_idx(path, np.ones((3, 3), dtype=np.uint8), True)
    np.testing.assert_array_equal(read_idx(str(path)), np.ones((3, 3), dtype=np.uint8))


def test_loads_a_directory_of_idx_files_scaled_with_channel_axis(tmp_path):
    raw = write_fashion_mnist(tmp_path, train=30, test=10)
    arrays = load_data(_settings(dir=str(tmp_path)), seed=0)
    assert arrays.train_images.shape == (30, 28, 28, 1) and arrays.test_images.shape == (10, 28, 28, 1)
    assert arrays.train_images.dtype == np.float32
    np.testing.assert_allclose(arrays.train_images[..., 0], raw["train_images"] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(arrays.test_labels, raw["test_labels"])
    assert 0.0 <= arrays.train_images.min() and arrays.train_images.max() <= 1.0


def test_uncompressed_files_and_prefixes(tmp_path):
    raw = write_fashion_mnist(tmp_path, train=30, test=10, compress=False)
    arrays = load_data(_settings(dir=str(tmp_path), train_examples=12, test_examples=4), seed=0)
    assert len(arrays.train_labels) == 12 and len(arrays.test_labels) == 4
    np.testing.assert_array_equal(arrays.train_labels, raw["train_labels"][:12])


def test_missing_file_names_it_and_the_fix(tmp_path):
    write_fashion_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(RunnerError, match=r"has no t10k-labels-idx1-ubyte\.gz.*Fix: point dataset\.dir"):
        load_data(_settings(dir=str(tmp_path)), seed=0)


def test_bad_magic_and_truncation_are_rejected(tmp_path):
    bad = tmp_path / "bad.idx"
    bad.write_bytes(b"PK\x03\x04not an idx file")
    with pytest.raises(RunnerError, match="not an IDX file"):
        read_idx(str(bad))
    truncated = tmp_path / "short.idx"
    write_idx(truncated, np.zeros((5, 28, 28)), compress=False)
    truncated.write_bytes(truncated.read_bytes()[:-100])
    with pytest.raises(RunnerError, match=r"truncated or malformed.*\(5, 28, 28\)"):
        read_idx(str(truncated))


def test_wrong_image_shape_is_rejected(tmp_path):
    write_fashion_mnist(tmp_path)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", np.zeros((30, 32, 32)))
    with pytest.raises(RunnerError, match=r"train files hold images \(30, 32, 32\)"):
        load_data(_settings(dir=str(tmp_path)), seed=0)


def test_synthetic_data_is_seeded_and_shaped_like_fashion_mnist():
    settings = _settings(name="synthetic", train_examples=64, test_examples=16)
    first, second = load_data(settings, seed=3), load_data(settings, seed=3)
    np.testing.assert_array_equal(first.train_images, second.train_images)
    assert first.train_images.shape == (64, 28, 28, 1) and first.test_labels.shape == (16,)
    assert set(np.unique(first.train_labels)) <= set(range(10))
    assert not np.array_equal(first.train_images, load_data(settings, seed=4).train_images)


def _label_batches(dataset) -> list[list[int]]:
    return [labels.numpy().tolist() for _, labels in dataset]


def test_train_dataset_batches_each_epoch_and_keeps_its_remainder():
    arrays = load_data(_settings(name="synthetic", train_examples=100, test_examples=10), seed=0)
    two_epochs = arrays.train_dataset(32, seed=0, first_epoch=1, epochs=2)
    assert [int(images.shape[0]) for images, _ in two_epochs] == [32, 32, 32, 4] * 2
    assert batches_per_epoch(100, 32) == 4
    first_epoch = _label_batches(arrays.train_dataset(32, seed=0, first_epoch=1, epochs=1))
    # Every example once per epoch, in a shuffled order.
    assert sorted(sum(first_epoch, [])) == sorted(arrays.train_labels.tolist())
    assert sum(first_epoch, []) != arrays.train_labels.tolist()


def test_epoch_batches_depend_only_on_seed_and_epoch():
    """What makes resume exact: epoch 3 is the same whether the run started at 1 or resumes at 3."""
    arrays = load_data(_settings(name="synthetic", train_examples=100, test_examples=10), seed=0)
    from_start = _label_batches(arrays.train_dataset(32, seed=5, first_epoch=1, epochs=3))
    resumed = _label_batches(arrays.train_dataset(32, seed=5, first_epoch=3, epochs=1))
    assert from_start[8:] == resumed
    endless = arrays.train_dataset(32, seed=5, first_epoch=1, epochs=None)
    assert _label_batches(endless.take(12)) == from_start
    assert from_start[:4] != from_start[4:8]  # a new order each epoch
    assert _label_batches(arrays.train_dataset(32, seed=6, epochs=1)) != from_start[:4]


def test_one_dataset_serves_every_epoch_through_its_epoch_variable():
    """loop=for_in and loop=in_function build their distributed dataset once (EpochDatasets) and set its epoch
    before each pass: pass e gives exactly epoch e's batches, and a preempted epoch's rest skips what was trained."""
    arrays = load_data(_settings(name="synthetic", train_examples=100, test_examples=10), seed=0)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    built = []

    def make_dataset(**epochs):
        built.append(epochs)
        return strategy.experimental_distribute_dataset(arrays.train_dataset(32, seed=5, **epochs))

    from_start = _label_batches(arrays.train_dataset(32, seed=5, first_epoch=1, epochs=3))
    datasets = EpochDatasets(make_dataset, reusable=True)
    assert [_label_batches(datasets.of_epoch(epoch)) for epoch in (1, 2, 3, 2)] == [
        from_start[:4],
        from_start[4:8],
        from_start[8:],
        from_start[4:8],
    ]
    assert len(built) == 1 and isinstance(built[0]["first_epoch"], tf.Variable)  # built once
    assert _label_batches(datasets.of_epoch(3, done_steps=1)) == from_start[9:]
    assert built[1] == {"first_epoch": 3, "epochs": 1, "skip_batches": 1}
    per_epoch = EpochDatasets(make_dataset, reusable=False)  # a source that takes the epoch as a number
    assert _label_batches(per_epoch.of_epoch(2)) == from_start[4:8] and built[2]["first_epoch"] == 2


def test_input_pipelines_take_disjoint_shards():
    arrays = load_data(_settings(name="synthetic", train_examples=64, test_examples=10), seed=0)
    shards = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2)
        dataset = arrays.train_dataset(8, 0, input_context=context)
        shards.append([image.tobytes() for images, _ in dataset for image in images.numpy()])
    assert len(shards[0]) == len(shards[1]) == 32
    assert not set(shards[0]) & set(shards[1])
    assert set(shards[0]) | set(shards[1]) == {image.tobytes() for image in arrays.train_images}


def test_corrupt_or_cut_gzip_is_rejected(tmp_path):
    bad = tmp_path / "x.gz"
    bad.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(RunnerError, match="not a readable gzip file.*Fix: replace it"):
        read_idx(str(bad))
    cut = tmp_path / "cut.gz"
    write_idx(cut, np.zeros((5, 28, 28)))
    cut.write_bytes(cut.read_bytes()[:40])
    with pytest.raises(RunnerError, match="not a readable gzip file"):
        read_idx(str(cut))

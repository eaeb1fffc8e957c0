"""The dataset kinds besides the built-ins (npz, tfrecord, image_folder, a callable's tf.data datasets), on tiny
files the tests write: each trains, each bad file is one paragraph, and streamed data is ordered, resumed
and split across workers as the runner promises."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import input_ops

from helpers.cli import run_cli
from helpers.config import dataset_settings
from helpers.data import (
    SHAPE,
    images,
    origin,
    tfrecord_data,
    tfrecord_keys,
    tfrecord_options,
    write_image_folder,
    write_npz,
    write_tfrecords,
)
from helpers.tracking import mlflow_client
from runner.data.loading import load_data
from runner.errors import RunnerError

# ---- every kind trains ----------------------------------------------------------------------------------


def _inputs(tracking_uri, run_id) -> dict[str, dict]:
    run = mlflow_client(tracking_uri).get_run(run_id)
    return {
        item.dataset.name: {
            "digest": item.dataset.digest,
            "source": json.loads(item.dataset.source),
            "source_type": item.dataset.source_type,
        }
        for item in run.inputs.dataset_inputs
    }


@pytest.mark.slow
def test_npz_trains_and_logs_its_file(tmp_path, train, tracking_uri):
    write_npz(tmp_path / "data.npz")
    result = train("strategy=one_device", "dataset=npz", f"dataset.path={tmp_path / 'data.npz'}")
    assert result.history[-1].train_loss > 0
    inputs = _inputs(tracking_uri, result.run_id)
    assert inputs["npz-train"]["source"] == {"uri": str(tmp_path / "data.npz")}


@pytest.mark.slow
def test_tfrecord_trains_streamed_and_logs_files_as_its_source(tmp_path, train, tracking_uri):
    write_tfrecords(tmp_path, "train", files=3, per_file=20)
    write_tfrecords(tmp_path, "test", files=1, per_file=10)
    result = train("strategy=one_device", *tfrecord_options(tmp_path))
    assert result.history[-1].train_loss > 0 and 0 <= result.eval_scores["eval_accuracy"] <= 1
    inputs = _inputs(tracking_uri, result.run_id)
    assert inputs["tfrecord-train"]["source"] == {"uri": str(tmp_path)}
    assert inputs["tfrecord-train"]["source_type"] == "local"
    assert inputs["tfrecord-train"]["digest"] != inputs["tfrecord-test"]["digest"]


@pytest.mark.slow
def test_image_folder_trains_and_its_model_takes_uint8_images(tmp_path, train, tracking_uri):
    """The logged model serves what the files hold: uint8 (height, width, channels), scaled inside."""
    import mlflow

    write_image_folder(tmp_path / "images")
    result = train(
        "strategy=one_device", "dataset=image_folder", f"dataset.dir={tmp_path / 'images'}", "mlflow.log_model=true"
    )
    assert result.history[-1].train_loss > 0
    mlflow.set_tracking_uri(tracking_uri)
    signature = mlflow.models.get_model_info(f"runs:/{result.run_id}/model").signature
    tensor = signature.inputs.inputs[0]
    assert (tensor.type, tuple(tensor.shape)) == (np.dtype("uint8"), (-1, 16, 12, 3))
    inputs = _inputs(tracking_uri, result.run_id)
    assert inputs["image_folder-train"]["source"] == {"uri": str(tmp_path / "images")}


@pytest.mark.slow  # trains three runs in this process: about 10 s
def test_a_callables_stream_of_unknown_length_needs_steps_per_epoch(train):
    stream = ["dataset._target_=helpers.data.stream_of_examples", "dataset.name=stream", "strategy=one_device"]
    with pytest.raises(RunnerError, match="^dataset.name='stream' streams examples.*Fix: pass loop.steps_per_epoch"):
        train(*stream)
    result = train(*stream, "loop.steps_per_epoch=3")
    assert result.history[-1].train_loss > 0


# ---- bad files: one paragraph each ----------------------------------------------------------------------


def _bad_npz(tmp_path):
    write_npz(tmp_path / "x.npz", y_train=np.full(40, 7))
    return "dataset.path=", dict(kind="npz", path=tmp_path / "x.npz", num_classes=4)


def _npz_without_key(tmp_path):
    np.savez(tmp_path / "x.npz", x_train=images(3), y_train=np.zeros(3, int))
    return "dataset.path=", dict(kind="npz", path=tmp_path / "x.npz")


def _missing_npz(tmp_path):
    return "dataset.path=", dict(kind="npz", path=tmp_path / "none.npz")


def _no_path(tmp_path):
    return "dataset.path is missing", dict(kind="npz")


def _empty_glob(tmp_path):
    write_tfrecords(tmp_path, "test", 1, 5)
    return "dataset.train_files=", dict(
        kind="tfrecord", train_files=f"'{tmp_path}/nothing-*.tfrecord'", test_files=f"'{tmp_path}/test-*.tfrecord'"
    )


def _tfrecords(tmp_path, **keys):
    write_tfrecords(tmp_path, "train", 2, 5)
    write_tfrecords(tmp_path, "test", 1, 5)
    return dict(kind="tfrecord", **tfrecord_keys(tmp_path, **keys))


def _wrong_key(tmp_path):
    return "dataset.image_key=", _tfrecords(tmp_path, image_key="pixels")


def _wrong_shape(tmp_path):
    return "dataset.image_shape=", {**_tfrecords(tmp_path), "image_shape": "[28,28]"}


def _labels_out_of_range(tmp_path):
    return "dataset.train_files=", _tfrecords(tmp_path, num_classes=2)


def _not_a_tfrecord(tmp_path):
    keys = _tfrecords(tmp_path)
    (tmp_path / "train-9.tfrecord").write_bytes(b"this is not a TFRecord file at all")
    return "dataset.train_files=", keys


def _no_test_folder(tmp_path):
    write_image_folder(tmp_path / "images")
    for image in (tmp_path / "images" / "test").rglob("*.png"):
        image.unlink()
    return "dataset.dir=", dict(kind="image_folder", dir=tmp_path / "images")


@pytest.mark.parametrize(
    "case",
    [
        _bad_npz,
        _npz_without_key,
        _missing_npz,
        _no_path,
        _empty_glob,
        _wrong_key,
        _wrong_shape,
        _labels_out_of_range,
        _not_a_tfrecord,
        _no_test_folder,
    ],
)
def test_a_bad_file_is_one_paragraph_naming_the_key(tmp_path, case):
    key, options = case(tmp_path)
    kind = options.pop("kind")
    with pytest.raises(RunnerError) as raised:
        load_data(dataset_settings(kind, **options), seed=0)
    message = str(raised.value)
    assert message.startswith(key) and "Fix:" in message and "\n" not in message, message


@pytest.mark.slow
def test_a_bad_file_exits_2_through_the_command(tmp_path):
    write_tfrecords(tmp_path, "train", 1, 4)
    write_tfrecords(tmp_path, "test", 1, 4)
    finished = run_cli(
        "strategy=one_device",
        *tfrecord_options(tmp_path, label_key="class"),
        "epochs=1",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"mlflow.tracking_uri=sqlite:///{tmp_path / 'm.db'}",
        cwd=tmp_path,
    )
    assert finished.returncode == 2, finished.stderr[-2000:]
    paragraph = [line for line in finished.stderr.splitlines() if "dataset.label_key='class'" in line]
    assert len(paragraph) == 1 and "Fix:" in paragraph[0], finished.stderr[-2000:]


# ---- the other tasks' labels, streamed ------------------------------------------------------------------


def _two_targets(image: np.ndarray) -> list[float]:
    """Two float targets per example (for task=regression, dataset.label_shape=[2])."""
    pixels = image.reshape(-1).astype(np.float64) / 255
    return [float(pixels.mean()), float(pixels.std())]


def _one_bit(image: np.ndarray) -> list[int]:
    return [int(image.reshape(-1)[2] > 127)]


def _three_bits(image: np.ndarray) -> list[int]:
    return [int(value > 127) for value in image.reshape(-1)[2:5]]


@pytest.mark.parametrize(
    ("task", "labels_of", "label_shape", "outputs"),
    [
        ("regression", _two_targets, "[2]", (2,)),
        ("regression", lambda image: _two_targets(image)[:1], None, (1,)),
        ("binary", _one_bit, None, (1,)),
        ("multilabel", _three_bits, "[3]", (3,)),
    ],
    ids=["regression-2", "regression-1", "binary", "multilabel"],
)
def test_tfrecord_labels_are_fed_as_the_task_takes_them(tmp_path, task, labels_of, label_shape, outputs):
    """int64s or floats under dataset.label_key, label_shape of them: float32 batches shaped like the model's
    output, in the files' order and value for value (the test split is read in order)."""
    write_tfrecords(tmp_path, "train", files=2, per_file=6, labels=labels_of)
    [test_images] = write_tfrecords(tmp_path, "test", files=1, per_file=5, labels=labels_of)
    data = tfrecord_data(tmp_path, task=task, **({"label_shape": label_shape} if label_shape else {}))
    assert data.spec.outputs == outputs and data.spec.num_classes == outputs[-1]
    [(_, labels)] = list(data.test_dataset(8))
    assert labels.dtype == tf.float32 and tuple(labels.shape) == (5, *outputs)
    expected = np.array([labels_of(image) for image in test_images], np.float32).reshape(5, *outputs)
    np.testing.assert_array_equal(labels.numpy(), expected)
    [(_, training)] = list(data.train_dataset(12, seed=1))
    assert tuple(training.shape) == (12, *outputs)


def test_a_callables_stream_of_float_targets_trains_a_regression(tmp_path):
    """A tf.data dataset of (image, float) pairs: the regression's targets, shaped (batch, 1)."""
    settings = dataset_settings("synthetic", _target_="helpers.data.stream_of_examples", name="stream", targets=True)
    data = load_data(settings, seed=0, task="regression")
    assert data.spec.outputs == (1,)
    [(inputs, labels)] = list(data.test_dataset(32).take(1))
    expected = inputs.numpy().reshape(len(inputs), -1).mean(axis=1)  # the image's mean pixel, scaled by 1/255
    assert labels.dtype == tf.float32 and tuple(labels.shape) == (32, 1)
    np.testing.assert_allclose(labels.numpy()[:, 0] / 255, expected, rtol=1e-5)


def _not_binary(tmp_path):
    write_tfrecords(tmp_path, "train", 1, 4, labels=lambda image: [2 * _one_bit(image)[0]])
    write_tfrecords(tmp_path, "test", 1, 4, labels=_one_bit)
    return "binary", "dataset.train_files=", "not 0/1 labels", {}


def _not_finite(tmp_path):
    write_tfrecords(tmp_path, "train", 1, 4, labels=lambda image: [float("nan")])
    write_tfrecords(tmp_path, "test", 1, 4, labels=lambda image: _two_targets(image)[:1])
    return "regression", "dataset.train_files=", "not finite targets", {}


def _label_shape_not_the_files(tmp_path):
    write_tfrecords(tmp_path, "train", 1, 4, labels=_three_bits)
    write_tfrecords(tmp_path, "test", 1, 4, labels=_three_bits)
    return "multilabel", "dataset.label_shape=[2]", "holds 3 label value(s)", {"label_shape": "[2]"}


def _float_classes(tmp_path):
    write_tfrecords(tmp_path, "train", 1, 4, labels=_two_targets)
    write_tfrecords(tmp_path, "test", 1, 4, labels=_two_targets)
    return "classification", "dataset.label_key='label'", "or use task=regression", {}


def _label_shape_of_classes(tmp_path):
    write_tfrecords(tmp_path, "train", 1, 4)
    write_tfrecords(tmp_path, "test", 1, 4)
    return "classification", "dataset.label_shape=[2] is for", "task=classification", {"label_shape": "[2]"}


def _one_value_for_many_tags(tmp_path):
    write_tfrecords(tmp_path, "train", 1, 4, labels=_one_bit)
    write_tfrecords(tmp_path, "test", 1, 4, labels=_one_bit)
    return "multilabel", "task=multilabel with dataset._target_=", "a vector of 0/1 labels", {}


@pytest.mark.parametrize(
    "case",
    [
        _not_binary,
        _not_finite,
        _label_shape_not_the_files,
        _float_classes,
        _label_shape_of_classes,
        _one_value_for_many_tags,
    ],
)
def test_streamed_labels_that_do_not_fit_the_task_are_one_paragraph(tmp_path, case):
    task, key, says, options = case(tmp_path)
    with pytest.raises(RunnerError) as raised:
        tfrecord_data(tmp_path, task=task, **options)
    message = str(raised.value)
    assert message.startswith(key) and says in message, message
    assert "Fix:" in message and "\n" not in message, message


def test_an_image_folders_classes_train_a_classification_only(tmp_path):
    write_image_folder(tmp_path / "images")
    with pytest.raises(RunnerError) as raised:
        load_data(dataset_settings("image_folder", dir=tmp_path / "images"), seed=0, task="regression")
    message = str(raised.value)
    assert message.startswith("task=regression with dataset._target_=") and "class index" in message, message
    assert "Fix: use task=classification" in message and "\n" not in message, message


@pytest.mark.slow  # one training in this process: about 8 s
def test_a_regression_on_tfrecord_files_logs_its_errors_and_no_accuracy(tmp_path, train):
    write_tfrecords(tmp_path, "train", files=4, per_file=16, labels=lambda image: _two_targets(image)[:1])
    write_tfrecords(tmp_path, "test", files=1, per_file=16, labels=lambda image: _two_targets(image)[:1])
    result = train(
        "strategy=one_device", "task=regression", *tfrecord_options(tmp_path), "dataset.validation_fraction=0.25"
    )
    keys = set(result.final.metrics())
    assert {"train_mae", "val_mae", "test_mae", "train_rmse", "val_rmse", "test_rmse"} <= keys
    assert not any("accuracy" in key for key in (*keys, *result.final_metrics, *result.eval_scores))
    assert result.eval_scores["eval_mae"] == pytest.approx(result.final["test_mae"], abs=1e-6)
    assert result.final["test_loss"] == pytest.approx(result.final["test_rmse"] ** 2, rel=1e-4)


# ---- streaming: order, resume, prefixes -------------------------------------------------------------------


def _epoch(data, epoch: int, seed: int = 7, batch: int = 8) -> list[tuple[int, int]]:
    return [
        item for images_, _ in data.train_dataset(batch, seed, first_epoch=epoch, epochs=1) for item in origin(images_)
    ]


def test_streamed_epochs_depend_only_on_seed_and_epoch(tmp_path):
    write_tfrecords(tmp_path, "train", files=5, per_file=12)
    write_tfrecords(tmp_path, "test", files=1, per_file=4)
    data, again = tfrecord_data(tmp_path), tfrecord_data(tmp_path)
    everything = sorted((file, record) for file in range(5) for record in range(12))
    third = _epoch(data, 3)
    assert sorted(third) == everything  # every example once
    assert [len(labels) for _, labels in data.train_dataset(8, 7, 3, 1)] == [8] * 7 + [4]  # 60 examples
    assert third == _epoch(again, 3)  # rebuilt from scratch: the same order
    assert third != _epoch(data, 2) and third != _epoch(data, 3, seed=8)
    file_order = [file for file, _ in third[:4]]
    assert file_order != sorted(file_order) or _epoch(data, 1)[:4] != third[:4]  # files in a per-epoch order


def test_resume_skips_the_batches_already_trained(tmp_path):
    write_tfrecords(tmp_path, "train", files=3, per_file=10)
    write_tfrecords(tmp_path, "test", files=1, per_file=4)
    data = tfrecord_data(tmp_path)
    stream = [origin(x) for x, _ in data.train_dataset(8, 3, first_epoch=1, epochs=None).take(12)]
    resumed = [origin(x) for x, _ in data.train_dataset(8, 3, first_epoch=1, epochs=None, skip_batches=5).take(7)]
    assert resumed == stream[5:]


def test_prefixes_read_the_first_files_only(tmp_path):
    write_tfrecords(tmp_path, "train", files=3, per_file=10)
    write_tfrecords(tmp_path, "test", files=2, per_file=4)
    data = tfrecord_data(tmp_path, train_examples=15, test_examples=5)
    assert data.train_examples == 15
    assert sorted(_epoch(data, 1)) == [(0, r) for r in range(10)] + [(1, r) for r in range(5)]
    assert sum(len(labels) for _, labels in data.test_dataset(4)) == 5
    assert data.inputs()[0]["features"]["shape"] == [15, *SHAPE]


def test_png_records_decode_to_the_images_written(tmp_path):
    written = write_tfrecords(tmp_path, "train", files=1, per_file=6, shape=(8, 8, 3), encoding="png")
    write_tfrecords(tmp_path, "test", files=1, per_file=3, shape=(8, 8, 3), encoding="png")
    data = tfrecord_data(tmp_path, image_encoding="png", image_shape="[8,8,3]")
    assert (data.spec.raw_shape, data.spec.raw_dtype) == ((8, 8, 3), "uint8")
    raw = data.raw_examples(3)
    assert raw.dtype == np.uint8 and raw.shape == (3, 8, 8, 3)
    batches = list(data.train_dataset(6, 0))
    pixels = np.rint(batches[0][0].numpy() * 255).astype(np.uint8)
    assert sorted(p.tobytes() for p in pixels) == sorted(p.tobytes() for p in written[0])


# ---- sharding across workers ------------------------------------------------------------------------------


def _worker_examples(data, workers: int, seed: int = 1, epoch: int = 1) -> list[list[tuple[int, int]]]:
    """What each MultiWorkerMirrored worker reads of one epoch: tf.data's auto-shard rewrite, as
    experimental_distribute_dataset applies it to each worker's copy (input_ops.auto_shard_dataset), under
    the policy the dataset's options carry."""
    dataset = data.train_dataset(8, seed, first_epoch=epoch, epochs=1)
    return [
        [item for x, _ in input_ops.auto_shard_dataset(dataset, workers, index, workers) for item in origin(x)]
        for index in range(workers)
    ]


def test_workers_read_disjoint_files_that_together_are_all_of_them(tmp_path):
    write_tfrecords(tmp_path, "train", files=4, per_file=6)
    write_tfrecords(tmp_path, "test", files=1, per_file=4)
    data = tfrecord_data(tmp_path, workers=2)
    assert data.shard_policy == "FILE"
    read = _worker_examples(data, 2)
    files = [{file for file, _ in examples} for examples in read]
    assert files[0].isdisjoint(files[1]) and files[0] | files[1] == {0, 1, 2, 3}
    # Every example of a worker's files, and nothing else: whole files, not every other example.
    for examples, mine in zip(read, files, strict=True):
        assert sorted(examples) == sorted((file, record) for file in mine for record in range(6))
    for epoch in (2, 3):  # another epoch, other files per worker, still a partition
        sets = [{file for file, _ in examples} for examples in _worker_examples(data, 2, epoch=epoch)]
        assert sets[0].isdisjoint(sets[1]) and sets[0] | sets[1] == {0, 1, 2, 3}


def test_fewer_files_than_workers_shard_by_example(tmp_path):
    write_tfrecords(tmp_path, "train", files=1, per_file=16)
    write_tfrecords(tmp_path, "test", files=1, per_file=4)
    data = tfrecord_data(tmp_path, workers=2)
    assert data.shard_policy == "DATA"
    read = _worker_examples(data, 2)
    assert read[0] and read[1] and set(read[0]).isdisjoint(read[1])
    assert sorted(read[0] + read[1]) == [(0, record) for record in range(16)]


def test_parameter_server_input_pipelines_read_their_own_files(tmp_path):
    write_tfrecords(tmp_path, "train", files=4, per_file=5)
    write_tfrecords(tmp_path, "test", files=1, per_file=4)
    data = tfrecord_data(tmp_path)
    files = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2)
        files.append({file for x, _ in data.train_dataset(4, 0, input_context=context) for file, _ in origin(x)})
    assert files[0].isdisjoint(files[1]) and files[0] | files[1] == {0, 1, 2, 3}


def test_the_benchmark_writes_the_workload_as_the_files_a_variant_reads(tmp_path):
    from bench.records import write
    from bench.variants import Workload, parse_variant

    variant = parse_variant("tfrecord=loop=multi_step data:tfrecord*2", 1)
    assert variant.overrides == ("loop=multi_step",) and (variant.data.kind, variant.data.copies) == ("tfrecord", 2)
    write(variant.data, None, 100, str(tmp_path))
    command = variant.command(Workload(None, 100, 1), str(tmp_path / "run"), "sqlite://")
    assert "dataset=tfrecord" in command and not any(item.startswith("dataset.train_examples") for item in command)
    where = tmp_path / "data" / "tfrecord-2x"
    data = load_data(
        dataset_settings(
            "tfrecord", train_files=f"'{where}/train-*.tfrecord'", test_files=f"'{where}/test-*.tfrecord'"
        ),
        seed=0,
    )
    assert data.train_examples == 200 and len(data.train_files) == 8


def test_a_streamed_global_batch_splits_into_replica_batches(tmp_path):
    """experimental_distribute_dataset cuts each global batch into per-replica batches by rewriting the
    pipeline's batch ops (_LegacyRebatchDataset, as the in-memory pipeline's batch size is unknown too); the
    streamed pipeline, which batches 1,024 records to decode them and then cuts batches, splits the same way."""
    from tensorflow.python.data.experimental.ops import distribute

    write_tfrecords(tmp_path, "train", files=2, per_file=40)
    write_tfrecords(tmp_path, "test", files=1, per_file=4)
    data = tfrecord_data(tmp_path)
    replica_batches = distribute._LegacyRebatchDataset(data.train_dataset(16, 0), 2)
    assert [len(labels) for _, labels in replica_batches] == [8] * 10

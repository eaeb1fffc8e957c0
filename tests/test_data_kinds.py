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
from helpers.tracking import mlflow_client
from runner.data.loading import load_data
from runner.data.source import DataSplits
from runner.errors import RunnerError

SHAPE = (16, 16)


def images(count: int, shape=SHAPE, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, *shape), dtype=np.uint8)


def write_tfrecords(
    directory,
    prefix: str,
    files: int,
    per_file: int,
    shape=SHAPE,
    encoding: str = "raw",
    classes: int = 3,
    label_offset: int = 0,
) -> list[np.ndarray]:
    """Files prefix-0.tfrecord, ...; the first two pixels of every image are (file index, record index), so
    a test can tell which file an example came from. Returns each file's images."""
    written = []
    for index in range(files):
        pixels = images(per_file, shape, seed=index)
        flat = pixels.reshape(per_file, -1)
        flat[:, 0], flat[:, 1] = index, np.arange(per_file)
        with tf.io.TFRecordWriter(str(directory / f"{prefix}-{index}.tfrecord")) as writer:
            for number, image in enumerate(pixels):
                data = (
                    image.tobytes()
                    if encoding == "raw"
                    else tf.io.encode_png(image if image.ndim == 3 else image[..., None]).numpy()
                )
                feature = {
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                    "label": tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[(number + index) % classes + label_offset])
                    ),
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        written.append(pixels)
    return written


def tfrecord_options(directory, **keys) -> list[str]:
    options = {
        "train_files": f"'{directory}/train-*.tfrecord'",
        "test_files": f"'{directory}/test-*.tfrecord'",
        "image_shape": f"[{','.join(map(str, SHAPE))}]",
        **keys,
    }
    return ["dataset=tfrecord", *(f"dataset.{key}={value}" for key, value in options.items())]


def tfrecord_data(directory, workers: int = 1, **keys):
    options = {
        "train_files": f"'{directory}/train-*.tfrecord'",
        "test_files": f"'{directory}/test-*.tfrecord'",
        "image_shape": f"[{','.join(map(str, SHAPE))}]",
        **keys,
    }
    return load_data(dataset_settings("tfrecord", **options), seed=0, workers=workers)


def write_image_folder(root, per_class: int = 4, classes=("cat", "dog"), size=(16, 12), channels: int = 3) -> None:
    for split in ("train", "test"):
        for label, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True)
            for number, image in enumerate(images(per_class, (*size, channels), seed=label)):
                (folder / f"{number}.png").write_bytes(tf.io.encode_png(image).numpy())


def write_npz(path, train: int = 40, test: int = 12, **replace) -> None:
    rng = np.random.default_rng(1)
    arrays = {
        "x_train": images(train),
        "y_train": rng.integers(0, 4, train),
        "x_test": images(test, seed=2),
        "y_test": rng.integers(0, 4, test),
        **replace,
    }
    np.savez(path, **arrays)


def origin(batch) -> list[tuple[int, int]]:
    """(file, record) of each example of a training batch (inputs scaled by 1/255)."""
    raw = np.rint(batch.numpy().reshape(len(batch), -1) * 255).astype(int)
    return [(int(row[0]), int(row[1])) for row in raw]


def stream_of_examples(count: int = 64, seed: int = 0) -> DataSplits:
    """A callable's own tf.data datasets of unknown length (a generator), as a user might write."""

    def split(size: int, offset: int):
        pixels, labels = images(size, seed=seed + offset), np.arange(size) % 3
        return tf.data.Dataset.from_generator(
            lambda: iter(zip(pixels, labels, strict=True)),
            output_signature=(tf.TensorSpec(SHAPE, tf.uint8), tf.TensorSpec((), tf.int64)),
        )

    return DataSplits(split(count, 0), split(count // 2, 1), num_classes=3)


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
    stream = ["dataset._target_=test_data_kinds.stream_of_examples", "dataset.name=stream", "strategy=one_device"]
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
    return dict(
        kind="tfrecord",
        train_files=f"'{tmp_path}/train-*.tfrecord'",
        test_files=f"'{tmp_path}/test-*.tfrecord'",
        image_shape="[16,16]",
        **keys,
    )


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

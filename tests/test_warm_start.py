"""Warm start (init.from): fine-tuning from a run directory's checkpoint, a run's logged model or a registered
model version. Real training on tiny synthetic data, in this process, against one real MLflow sqlite store that
every test of this file shares (the source run registers `synthetic` there)."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from helpers.cli import run_cli
from helpers.config import REPO, compose
from helpers.presets import TINY, WITH_MODEL
from helpers.tracking import mlflow_client
from runner.config.settings import init_settings, validate
from runner.errors import RunnerError
from runner.training.warm_start import FROM_TAG, MODEL_VERSION_TAG, SOURCE_RUN_TAG, warm_start

# A source that has learnt: its loss is far below a fresh model's ln(10) = 2.30.
SOURCE = ("optimizer.lr=0.003", "batch=32", "epochs=4", "strategy=one_device")
# One step per epoch (loop=for_in would run the whole dataset): epoch 1's train_loss is the first step's loss,
# taken with the initial weights.
FIRST_STEP = ("loop=iterator", "loop.steps_per_epoch=1")
FRESH_LOSS = math.log(10)


def _run(tracking_uri: str, run_dir: Path, *overrides: str):
    from omegaconf import OmegaConf

    from runner.tracking.opening import opened_tracker
    from runner.train import run

    args = [*TINY, f"mlflow.tracking_uri={tracking_uri}", *overrides]
    settings = validate(OmegaConf.to_container(compose(args), resolve=True))
    with opened_tracker(settings.mlflow, tracks=True, in_process=True) as tracker:
        return run(settings, str(run_dir), tracker, args)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """This file's working directory (MLflow puts a new experiment's artifacts under ./mlruns)."""
    path = tmp_path_factory.mktemp("warm_start")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(path)
        yield path


@pytest.fixture(scope="module")
def tracking_uri(workdir) -> str:
    """One store for the file: the source's model and registration are what the other tests start from."""
    return f"sqlite:///{workdir / 'mlflow.db'}"


@pytest.fixture(scope="module")
def source(workdir, tracking_uri):
    """A trained CNN that logged its model and registered it as `synthetic` (its champion)."""
    run_dir = workdir / "source"
    result = _run(tracking_uri, run_dir, *SOURCE, WITH_MODEL, "mlflow.register=true")
    assert result.final.train_loss < FRESH_LOSS / 2  # it learnt: a warm start from it shows
    checkpoint = tf.train.latest_checkpoint(str(run_dir / "checkpoints"))
    return SimpleNamespace(run_dir=run_dir, run_id=result.run_id, checkpoint=checkpoint)


def _source_weights(checkpoint: str) -> list[np.ndarray]:
    from runner.builtins.models import cnn
    from runner.training.checkpoints import restore_without_strategy

    return [w.numpy() for w in restore_without_strategy(checkpoint, lambda: cnn((28, 28, 1), 10)).weights]


def test_the_config_takes_a_directory_a_checkpoint_or_an_mlflow_uri(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "ckpt-8.index").write_bytes(b"")
    assert init_settings({"from": None}).source is None
    assert init_settings({}).source is None
    for given in (run_dir, run_dir / "checkpoints"):
        assert init_settings({"from": str(given)}) == init_settings({"from": str(run_dir / "checkpoints")})
        assert init_settings({"from": str(given)}).kind == "checkpoint"
    assert init_settings({"from": str(run_dir / "checkpoints" / "ckpt-8")}).source == str(
        run_dir / "checkpoints" / "ckpt-8"
    )
    for uri, kind in (
        ("runs:/0a1b/model", "runs"),
        ("models:/fashion_mnist@champion", "models"),
        ("models:/fashion_mnist/3", "models"),
    ):
        assert init_settings({"from": uri}) == init_settings({"from": uri}).__class__(uri, kind)
    model_id = "m-" + "0123456789abcdef" * 2  # a LoggedModel's id, alone or as models:/<id>
    for given in (model_id, f"models:/{model_id}"):
        assert (init_settings({"from": given}).source, init_settings({"from": given}).kind) == (
            model_id,
            "logged_model",
        )
    # The composed config has the key, null by default.
    assert validate(_composed()).init.source is None


def _composed(*overrides: str):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(compose([*TINY, *overrides]), resolve=True)


@pytest.mark.parametrize(
    "value, why",
    [
        ("{missing}", "there is no directory"),
        ("{empty}", "holds no checkpoint"),
        ("runs:/0a1b", "runs:/<run id>/<artifact path>"),
        ("models:/fashion_mnist", "models:/<name>@<alias> or models:/<name>/<version number>"),
        ("models:/fashion_mnist/latest", "models:/<name>@<alias> or models:/<name>/<version number>"),
        ("s3://bucket/checkpoints", "runs:/ and models:/ URIs and from local checkpoint directories"),
    ],
)
def test_a_bad_init_from_is_refused_naming_it(tmp_path, value, why):
    (tmp_path / "empty").mkdir()
    value = value.format(missing=tmp_path / "nowhere", empty=tmp_path / "empty")
    with pytest.raises(RunnerError) as raised:
        validate(_composed(f"init.from={value}"))
    message = str(raised.value)
    assert message.startswith(f"init.from={value!r} is not valid: ") and why in message, message
    assert "Fix: " in message and "\n" not in message


def test_the_command_refuses_a_bad_init_from_in_one_paragraph_with_exit_2(tmp_path):
    done = run_cli(
        *TINY,
        f"init.from={tmp_path / 'nowhere'}",
        f"mlflow.tracking_uri=sqlite:///{tmp_path / 'm.db'}",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith(f"error: init.from='{tmp_path / 'nowhere'}' is not valid: there is no directory")
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "m.db").exists()  # refused before any MLflow run (or store) exists


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
@pytest.mark.parametrize("kind", ["run directory", "runs:/", "models:/@champion", "LoggedModel id"])
def test_the_weights_before_step_1_are_the_sources(source, tracking_uri, kind, strategy):
    """Every variable of a model freshly built in a strategy's scope takes the source checkpoint's value: the
    logged and the registered model are that same checkpoint."""
    from runner.builtins.models import cnn
    from runner.tracking.mlflow_tracker import run_model

    if kind == "LoggedModel id":
        given = run_model(mlflow_client(tracking_uri), source.run_id).model_id
    else:
        given = {
            "run directory": str(source.run_dir),
            "runs:/": f"runs:/{source.run_id}/model",
            "models:/@champion": "models:/synthetic@champion",
        }[kind]
    with (
        tf.distribute.OneDeviceStrategy("/cpu:0")
        if strategy == "one_device"
        else tf.distribute.MirroredStrategy(["/cpu:0"])
    ).scope():
        model = cnn((28, 28, 1), 10)
    before = [w.numpy() for w in model.weights]
    origin = warm_start(init_settings({"from": given}), model, tracking_uri, resumed_from=None)
    expected = _source_weights(source.checkpoint)
    assert origin.variables == len(expected) == 8
    for variable, value, initial in zip(model.weights, expected, before, strict=True):
        np.testing.assert_array_equal(variable.numpy(), value, err_msg=variable.name)
        assert not np.array_equal(value, initial), variable.name  # a test that can fail: they did change
    assert origin.tags[SOURCE_RUN_TAG] == source.run_id
    if kind == "LoggedModel id":
        assert origin.tags["init.model_id"] == given and origin.description.startswith(f"LoggedModel {given} (model ")


def test_a_version_registered_from_a_logged_model_id_loads_from_this_store(source, tracking_uri, tmp_path, monkeypatch):
    """mlflow.register_model gives a version the source models:/<model id>, which MLflow's download looks up in
    MLflow's default store: here that is another (empty) store, so only the run's own store can answer."""
    import mlflow

    from runner.builtins.models import cnn
    from runner.tracking.mlflow_tracker import run_model

    client = mlflow_client(tracking_uri)
    logged = run_model(client, source.run_id)
    client.create_registered_model("by_model_id")
    client.create_model_version(
        "by_model_id", f"models:/{logged.model_id}", run_id=source.run_id, model_id=logged.model_id
    )
    monkeypatch.chdir(tmp_path)
    default = mlflow.get_tracking_uri()  # the source's model logging set it to this file's store
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        model = cnn((28, 28, 1), 10)
        origin = warm_start(init_settings({"from": "models:/by_model_id/1"}), model, tracking_uri, resumed_from=None)
    finally:
        mlflow.set_tracking_uri(default)
    assert origin.tags[MODEL_VERSION_TAG] == "by_model_id/1"
    for variable, value in zip(model.weights, _source_weights(source.checkpoint), strict=True):
        np.testing.assert_array_equal(variable.numpy(), value, err_msg=variable.name)


def test_fine_tuning_from_a_run_directory_starts_where_the_source_ended(source, train, tracking_uri, tmp_path):
    fresh = train(*FIRST_STEP, run_dir=tmp_path / "fresh")
    tuned = train(*FIRST_STEP, f"init.from={source.run_dir}", run_dir=tmp_path / "tuned")
    assert fresh.history[0].train_loss > 0.9 * FRESH_LOSS
    assert tuned.history[0].train_loss < FRESH_LOSS / 2
    assert tuned.history[0].train_loss < fresh.history[0].train_loss / 2
    run = mlflow_client(tracking_uri).get_run(tuned.run_id)
    assert run.data.params["init.from"] == str(source.run_dir)  # as given
    assert run.data.tags[FROM_TAG] == source.checkpoint  # what was loaded
    assert run.data.tags[SOURCE_RUN_TAG] == source.run_id
    assert FROM_TAG not in mlflow_client(tracking_uri).get_run(fresh.run_id).data.tags


@pytest.mark.parametrize("given", ["models:/synthetic@champion", "runs:/{run_id}/model"])
def test_fine_tuning_the_champion_or_a_runs_model_is_one_command(source, train, tracking_uri, tmp_path, caplog, given):
    given = given.format(run_id=source.run_id)
    with caplog.at_level(logging.INFO, logger="runner"):
        tuned = train(f"init.from={given}", "epochs=1", *FIRST_STEP, run_dir=tmp_path / "tuned")
    assert tuned.history[0].train_loss < FRESH_LOSS / 2
    run = mlflow_client(tracking_uri).get_run(tuned.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["init.from"] == given and run.data.tags[FROM_TAG] == given
    assert run.data.tags[SOURCE_RUN_TAG] == source.run_id
    if given.startswith("models:/"):
        assert run.data.tags[MODEL_VERSION_TAG] == "synthetic/1"
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("initialised the model from")]
    assert given in line and line.endswith("(8 variables)")


@pytest.mark.parametrize("kind", ["run directory", "runs:/"])
def test_a_source_of_another_shape_names_the_first_mismatching_variable(source, train, tracking_uri, tmp_path, kind):
    """The source has 10 classes, this data 5: the dense logits' kernel is the first variable that differs."""
    given = str(source.run_dir) if kind == "run directory" else f"runs:/{source.run_id}/model"
    client = mlflow_client(tracking_uri)
    runs_before = _run_ids(client)
    with pytest.raises(RunnerError) as raised:
        train(f"init.from={given}", "+dataset.num_classes=5", run_dir=tmp_path / "five")
    message = str(raised.value)
    assert "init.from=" in message and "\n" not in message
    assert "/kernel:0 has shape (64, 10) in the source and (64, 5) here. Fix: " in message, message
    assert message.split(" variable ")[1].startswith("dense"), message
    assert _run_ids(client) == runs_before  # refused before the MLflow run was created: nothing left RUNNING


def test_a_registered_model_that_does_not_exist_is_one_paragraph(source, train, tracking_uri, tmp_path):
    client = mlflow_client(tracking_uri)
    runs_before = _run_ids(client)
    for given in (
        "models:/synthetic@nobody",
        "models:/synthetic/99",
        "models:/no_such_model@champion",
        "runs:/0123456789abcdef/model",
        "m-" + "0" * 32,  # a LoggedModel id
    ):
        with pytest.raises(RunnerError) as raised:
            train(f"init.from={given}", run_dir=tmp_path / "missing")
        message = str(raised.value)
        assert message.startswith(f"init.from={given!r} names a ") and "does not have" in message, message
        assert tracking_uri in message and "Fix: " in message and "\n" not in message
    assert _run_ids(client) == runs_before


def test_a_resumed_run_keeps_its_own_checkpoint_and_says_init_from_is_ignored(source, train, tmp_path, caplog):
    run_dir = tmp_path / "tuned"
    first = train(*FIRST_STEP, f"init.from={source.run_dir}", run_dir=run_dir)
    caplog.clear()  # the first run's lines, which the runner logger's level may have let through
    with caplog.at_level(logging.INFO, logger="runner"):
        again = train(*FIRST_STEP, f"init.from={source.run_dir}", run_dir=run_dir)  # the same command again
    assert again.run_id == first.run_id
    messages = [r.getMessage() for r in caplog.records]
    ignored = [m for m in messages if "is ignored" in m]
    assert len(ignored) == 1 and str(run_dir / "checkpoints" / "ckpt-1") in ignored[0], messages
    assert not any(m.startswith("initialised the model from") for m in messages)


def test_a_model_logged_as_tf_keras_before_savedmodels_still_warm_starts(source, tracking_uri):
    """Runs logged their model as a saved tf_keras model (the raw-input wrapper) before the runner logged
    SavedModels: such a model, logged here the way the runner did then, still gives its trained network's weights."""
    import mlflow
    import mlflow.tensorflow
    from omegaconf import OmegaConf

    from runner.builtins.models import cnn
    from runner.config.settings import validate
    from runner.data.source import DataSpec
    from runner.training.task import Experiment

    client = mlflow_client(tracking_uri)
    experiment_id = client.get_run(source.run_id).info.experiment_id
    old_run = client.create_run(experiment_id, run_name="logged-before-savedmodels").info.run_id
    trained = _source_weights(source.checkpoint)
    network = cnn((28, 28, 1), 10)
    for variable, value in zip(network.weights, trained, strict=True):
        variable.assign(value)
    settings = validate(OmegaConf.to_container(compose([*TINY]), resolve=True))
    spec = DataSpec(
        name="synthetic", raw_shape=(28, 28), raw_dtype="uint8", input_shape=(28, 28, 1), num_classes=10, scale=255.0
    )
    wrapper = Experiment.from_settings(settings, spec).export_model(network)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(experiment_id=experiment_id)
    info = mlflow.tensorflow.log_model(wrapper, name="model", run_id=old_run, pip_requirements=["tensorflow"])
    assert info.flavors["tensorflow"]["model_type"] == "keras"  # the old form: a saved tf_keras model
    client.set_terminated(old_run)

    model = cnn((28, 28, 1), 10)
    origin = warm_start(init_settings({"from": f"runs:/{old_run}/model"}), model, tracking_uri, resumed_from=None)
    assert origin.variables == 8 and origin.tags[SOURCE_RUN_TAG] == old_run
    for variable, value in zip(model.weights, trained, strict=True):
        np.testing.assert_array_equal(variable.numpy(), value, err_msg=variable.name)


def _run_ids(client) -> set[tuple[str, str]]:
    experiments = [e.experiment_id for e in client.search_experiments()]
    return {(run.info.run_id, run.info.status) for run in client.search_runs(experiments)}


# Run in a fresh process: splitting the CPU into two replicas can happen once per process, before any tensor.
TWO_REPLICAS = """
import sys
import runner
import numpy as np
import tensorflow as tf
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
from runner.builtins.models import resnet
from runner.config.settings import init_settings
from runner.training.checkpoints import restore_without_strategy
from runner.training.warm_start import warm_start

tracking_uri, checkpoint, *sources = sys.argv[1:]
build = lambda: resnet((28, 28, 1), 10, widths=[8], blocks_per_stage=1)
expected = [w.numpy() for w in restore_without_strategy(checkpoint, build).weights]
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
for source in sources:
    with strategy.scope():
        model = build()
    origin = warm_start(init_settings({"from": source}), model, tracking_uri, resumed_from=None)
    assert origin.variables == len(expected) == len(model.weights), origin
    for variable, value in zip(model.weights, expected):
        copies = strategy.experimental_local_results(variable)
        assert len(copies) == 2, (variable.name, copies)
        for copy in copies:
            np.testing.assert_array_equal(copy.numpy(), value, err_msg=f"{source}: {variable.name} on {copy.device}")
    print("every replica holds the source's", len(expected), "variables:", source, flush=True)
"""


def test_mirrored_over_two_cpu_replicas_gives_every_replica_the_sources_weights(workdir, tracking_uri):
    """A ResNet's variables, BatchNorm's on-read moving statistics included, on both replicas' copies."""
    run_dir = workdir / "resnet"
    trained = _run(
        tracking_uri,
        run_dir,
        "model=resnet",
        "model.widths=[8]",
        "model.blocks_per_stage=1",
        "strategy=one_device",
        WITH_MODEL,
    )
    checkpoint = tf.train.latest_checkpoint(str(run_dir / "checkpoints"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", TWO_REPLICAS, tracking_uri, checkpoint, str(run_dir), f"runs:/{trained.run_id}/model"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("every replica holds the source's") == 2, done.stdout

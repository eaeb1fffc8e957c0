"""The example project examples/mylab as a user runs it: copied to a directory of its own, its data written
by its own make_data.py, then `python -m runner hydra.searchpath=[file://conf_mylab] model=my_mlp
dataset=my_digits ...` run from that directory with it on PYTHONPATH (the runner comes from the environment).
Real processes, a real MLflow store, real serving.

Each slow scenario runs once. The digits (classification): one device (its logged model served), two mirrored
replicas (replica invariance against the one-device run), MultiWorkerMirrored streaming the TFRecord shards, and
the example's Keras 3 model on one device (served) and two mirrored replicas. The diabetes data (task=regression,
the runner's npz kind): one device (its logged model predicting at test_mae), two mirrored replicas and a local
MultiWorkerMirrored cluster (each against the one-device run), a local ParameterServer cluster, and a seeded sweep
over the model's own argument and the optimizer that chooses the lowest val_mae and registers a champion.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import run_cli
from helpers.config import REPO
from helpers.serving import post_invocations, serving
from helpers.sweeps import children, parent_id_of
from helpers.tracking import load_model, metric_history, mlflow_client

EXAMPLE = REPO / "examples" / "mylab"
# What every command of the example's README starts with.
MYLAB = ["hydra.searchpath=[file://conf_mylab]", "model=my_mlp", "mlflow.experiment_name=mylab", "progress=false"]
# The example's data, held in memory. With the built-in kind: ["dataset=npz", "dataset.path=data/digits.npz",
# "dataset.name=digits", "dataset.scale=16"].
DIGITS = ["dataset=my_digits"]
# The same data streamed from its TFRecord shards by the built-in kind (the example's own my_digits_tfrecord
# option does the same through its callable).
DIGITS_TFRECORD = [
    "dataset=tfrecord",
    "dataset.train_files=data/tfrecord/train-*.tfrecord",
    "dataset.test_files=data/tfrecord/test-*.tfrecord",
    "dataset.image_key=image",
    "dataset.label_key=label",
    "dataset.image_shape=[8,8]",
    "dataset.image_encoding=raw",
    "dataset.name=digits",
    "dataset.scale=16",
]
TEST_EXAMPLES = 357  # make_data.py's split of scikit-learn's 1,797 digits
EPOCHS = ["epochs=3"]
# The regression as the example's README runs it: scikit-learn's diabetes data through the runner's npz kind.
REGRESSION = ["task=regression", "dataset=my_diabetes", "optimizer.lr=0.01"]
# Its single runs hold out a validation split, so that val_ errors are logged each epoch as train_ and test_ ones
# are (a sweep's jobs hold one out by themselves).
DIABETES = [*REGRESSION, "dataset.validation_fraction=0.2"]
TEST_PATIENTS = 89  # make_data.py's split of scikit-learn's 442 patients


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A copy of examples/mylab with its data written by its own script, as a user's checkout would be."""
    directory = tmp_path_factory.mktemp("user") / "mylab"
    shutil.copytree(
        EXAMPLE, directory, ignore=shutil.ignore_patterns("data", "outputs", "multirun", "mlflow.db", "__pycache__")
    )
    done = subprocess.run([sys.executable, "make_data.py"], cwd=directory, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(path.name for path in (directory / "data" / "tfrecord").iterdir()) == [
        "test-00000-of-00001.tfrecord",
        *(f"train-{shard:05d}-of-00004.tfrecord" for shard in range(4)),
    ]
    return directory


def _env(project: Path) -> dict[str, str]:
    """The user's PYTHONPATH: their project first, then whatever gives this environment the runner."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(project), os.environ.get("PYTHONPATH")]))}


def runner(project: Path, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_cli(*overrides, cwd=project, env=_env(project), timeout=timeout)


def train(project: Path, name: str, *overrides: str, data: list[str] = DIGITS) -> str:
    """One run of the example (on the digits unless `data` says otherwise) in outputs/<name>; its MLflow run id."""
    done = runner(project, *MYLAB, *data, *EPOCHS, f"hydra.run.dir=outputs/{name}", *overrides)
    assert done.returncode == 0, done.stderr[-3000:]
    return (project / "outputs" / name / "mlflow_run_id.txt").read_text().strip()


def _client(project: Path):
    return mlflow_client(f"sqlite:///{project / 'mlflow.db'}")  # MLflow's default store, where the user ran


def _losses(project: Path, run_id: str) -> list[float]:
    return [value for _, value in metric_history(_client(project), run_id, "train_loss")]


def _test_split(project: Path, name: str = "digits") -> tuple[np.ndarray, np.ndarray]:
    with np.load(project / "data" / f"{name}.npz") as data:
        return data["x_test"], data["y_test"]


def assert_predicts_at_test_mae(project: Path, uri: str, test_mae: float) -> None:
    """The logged model, given the raw test measurements, predicts values whose mean absolute error from the test
    targets is the run's test_mae (float32 sums in another order: within 1e-5 relative)."""
    measurements, targets = _test_split(project, "diabetes")
    assert measurements.shape == (TEST_PATIENTS, 10) and targets.dtype == np.float32
    predictions = np.asarray(load_model(f"sqlite:///{project / 'mlflow.db'}", uri).predict(measurements))
    assert predictions.shape == (TEST_PATIENTS, 1), predictions.shape
    mae = float(np.mean(np.abs(predictions[:, 0] - targets)))
    assert mae == pytest.approx(test_mae, rel=1e-5), (mae, test_mae)


def assert_same_losses(project: Path, run_id: str, reference_id: str, label: str) -> None:
    """Replica invariance: the per-epoch train_loss of the run equals the reference's (relative difference
    below 1e-3): the loss is averaged over the global batch, so 2 x 32 trains as 1 x 64 does."""
    losses, expected = _losses(project, run_id), _losses(project, reference_id)
    differences = [abs(ours - theirs) / theirs for ours, theirs in zip(losses, expected, strict=False)]
    print(f"{label} vs one_device train_loss: {losses} vs {expected}, relative differences {differences}")
    assert len(losses) == len(expected) == 3 and max(differences) < 1e-3, (losses, expected)
    assert expected[-1] < expected[0]


@pytest.fixture(scope="module")
def one_device_run(project) -> str:
    """The example on one device, logging its model; its run id."""
    return train(project, "one_device", "strategy=one_device")


@pytest.fixture(scope="module")
def regression_run(project) -> str:
    """The regression example on one device, logging its model; its run id."""
    return train(project, "regression_one_device", "strategy=one_device", data=DIABETES)


def assert_errors_not_accuracy(project: Path, run_id: str, epochs: int = 3) -> None:
    """A regression's run: train_, val_ and test_ mae and rmse at every epoch, eval_ ones after the restore, and no
    accuracy anywhere."""
    client = _client(project)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert not [key for key in run.data.metrics if "accuracy" in key], sorted(run.data.metrics)
    for split in ("train", "val", "test"):
        for error in ("mae", "rmse"):
            steps = [step for step, _ in metric_history(client, run_id, f"{split}_{error}")]
            assert steps == list(range(1, epochs + 1)), (split, error, steps)
    assert {"eval_mae", "eval_rmse"} <= set(run.data.metrics)


def test_searchpath_is_passed_on_with_file_paths_made_absolute():
    from omegaconf import OmegaConf

    from runner.searchpath import searchpath_overrides

    hydra = OmegaConf.create(
        {
            "runtime": {"cwd": "/home/me/lab"},
            "searchpath": ["file://conf_mylab", "file:///opt/it's, here", "pkg://mylab.conf"],
        }
    )
    assert searchpath_overrides(hydra) == [
        r"hydra.searchpath=['file:///home/me/lab/conf_mylab','file:///opt/it\'s, here','pkg://mylab.conf']"
    ]
    assert searchpath_overrides(OmegaConf.create({"runtime": {"cwd": "/x"}, "searchpath": []})) == []


def test_swapping_the_default_models_target_keeps_its_arguments_which_the_example_model_accepts(monkeypatch):
    """`model._target_=mylab.models.mlp +model.hidden=256` from the default cnn option: the cnn's weight_decay
    stays in the config, and mlp takes it."""
    from omegaconf import OmegaConf

    from helpers.config import compose
    from runner.config.settings import checked_targets, validate
    from runner.data.source import DataSpec
    from runner.training.task import Experiment

    monkeypatch.syspath_prepend(str(EXAMPLE))
    settings = validate(
        OmegaConf.to_container(
            compose(["dataset=synthetic", "model._target_=mylab.models.mlp", "+model.hidden=256"]), resolve=True
        )
    )
    assert dict(settings.model.arguments) == {"weight_decay": 1e-5, "hidden": 256}
    checked_targets(settings)
    spec = DataSpec("digits", (8, 8, 1), 10, (8, 8), "uint8", 16.0)
    model = Experiment.from_settings(settings, spec).build_model()
    assert [layer.units for layer in model.layers[1:]] == [256, 10] and len(model.losses) == 2


def test_the_keras3_option_builds_a_keras3_model_that_the_builtin_optimizer_follows(monkeypatch):
    """model=my_mlp_keras3: a Keras 3 model, and optimizer=adam (the default) then builds a Keras 3 Adam."""
    from omegaconf import OmegaConf

    from helpers.config import compose
    from runner.builtins import keras_lane
    from runner.config.settings import checked_targets, validate
    from runner.data.source import DataSpec
    from runner.training.task import Experiment

    monkeypatch.syspath_prepend(str(EXAMPLE))
    searchpath = f"hydra.searchpath=[file://{EXAMPLE / 'conf_mylab'}]"
    config = compose(["dataset=synthetic", searchpath, "model=my_mlp_keras3"])
    settings = validate(OmegaConf.to_container(config, resolve=True))
    checked_targets(settings)
    task = Experiment.from_settings(settings, DataSpec("digits", (8, 8, 1), 10, (8, 8), "uint8", 16.0))
    try:
        model = task.build_model()
        optimizer = task.build_optimizer(0.001)
        assert keras_lane.version_of(model) == keras_lane.version_of(optimizer) == 3
        assert type(optimizer).__module__.startswith("keras.") and model.output_shape == (None, 10)
    finally:
        keras_lane.select(2)  # this process's other tests build tf_keras models


@pytest.fixture
def served(project, one_device_run):
    """The documented `mlflow models serve` command for the run's model, from the example's directory, with neither
    the example nor the runner on PYTHONPATH (the model needs neither); its base URL."""
    with serving(f"runs:/{one_device_run}/model", project) as url:
        yield url


@pytest.mark.slow
@pytest.mark.server
def test_one_device_run_logs_a_model_that_serves_the_raw_digits_at_eval_accuracy(project, one_device_run, served):
    run = _client(project).get_run(one_device_run)
    assert run.info.status == "FINISHED"
    assert _client(project).get_experiment(run.info.experiment_id).name == "mylab"
    assert run.data.params["model._target_"] == "mylab.models.mlp" and run.data.params["model.hidden"] == "128"
    eval_accuracy = run.data.metrics["eval_accuracy"]
    print(f"one_device, {EPOCHS}: eval_accuracy {eval_accuracy:.4f}")
    assert eval_accuracy > 0.8  # it learned: ten classes, chance is 0.1
    assert_serves_at_eval_accuracy(project, served, eval_accuracy)


def assert_serves_at_eval_accuracy(project: Path, url: str, eval_accuracy: float) -> None:
    """The served model, asked about the raw test digits, is right exactly as often as eval_accuracy says."""
    images, labels = _test_split(project)  # as the files hold them: uint8 0-16, (357, 8, 8)
    assert images.dtype == np.uint8 and images.shape == (TEST_EXAMPLES, 8, 8) and images.max() == 16
    status, answer = post_invocations(url, {"inputs": images.tolist()})
    assert status == 200, answer
    probabilities = np.array(answer["predictions"])
    assert probabilities.shape == (TEST_EXAMPLES, 10)
    correct = int(np.sum(probabilities.argmax(axis=1) == labels))
    assert correct == round(eval_accuracy * TEST_EXAMPLES), (correct, eval_accuracy)
    assert np.float32(correct / TEST_EXAMPLES) == np.float32(eval_accuracy)


@pytest.mark.slow
@pytest.mark.server
def test_the_keras3_option_trains_on_two_mirrored_replicas_as_on_one_device_and_serves_at_eval_accuracy(project):
    """model=my_mlp_keras3 as the README runs it: a Keras 3 model, with the built-in optimizer following its Keras,
    on one device (its model logged, served without TF_USE_LEGACY_KERAS) and on two mirrored replicas."""
    one_device = train(project, "keras3_one_device", "model=my_mlp_keras3", "strategy=one_device")
    mirrored = train(
        project,
        "keras3_mirrored",
        "model=my_mlp_keras3",
        "strategy=mirrored",
        "strategy.cpu_replicas=2",
        "batch=32",
        "mlflow.log_model=false",
    )
    run = _client(project).get_run(one_device)
    assert run.data.params["model._target_"] == "mylab.keras3_models.mlp"
    assert _client(project).get_run(mirrored).data.params["num_replicas"] == "2"
    assert_same_losses(project, mirrored, one_device, "Keras 3 mirrored, 2 replicas")
    eval_accuracy = run.data.metrics["eval_accuracy"]
    assert eval_accuracy > 0.8
    with serving(f"runs:/{one_device}/model", project) as url:
        assert_serves_at_eval_accuracy(project, url, eval_accuracy)


@pytest.mark.slow
def test_two_mirrored_replicas_train_the_users_model_as_one_device_does(project, one_device_run):
    run_id = train(
        project, "mirrored", "strategy=mirrored", "strategy.cpu_replicas=2", "batch=32", "mlflow.log_model=false"
    )
    assert _client(project).get_run(run_id).data.params["num_replicas"] == "2"
    assert_same_losses(project, run_id, one_device_run, "mirrored, 2 replicas")


@pytest.mark.slow
def test_a_regression_on_one_device_logs_its_errors_and_its_model_predicts_at_test_mae(project, regression_run):
    assert_errors_not_accuracy(project, regression_run)
    run = _client(project).get_run(regression_run)
    assert run.data.params["task.kind"] == "regression" and run.data.params["loss._target_"].endswith(
        "mean_squared_error"
    )
    losses = _losses(project, regression_run)
    assert losses[-1] < losses[0], losses
    assert_predicts_at_test_mae(project, f"runs:/{regression_run}/model", run.data.metrics["test_mae"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "overrides"),
    [
        ("mirrored", ["strategy.cpu_replicas=2"]),
        # Two worker processes that compose the config anew (the searchpath passed on) and import mylab.
        ("multi_worker_mirrored", ["cluster=local"]),
    ],
)
def test_a_regression_trains_on_two_replicas_as_on_one_device(project, regression_run, strategy, overrides):
    run_id = train(
        project,
        f"regression_{strategy}",
        f"strategy={strategy}",
        *overrides,
        "batch=32",
        "mlflow.log_model=false",
        data=DIABETES,
    )
    assert _client(project).get_run(run_id).data.params["num_replicas"] == "2"
    assert_errors_not_accuracy(project, run_id)
    assert_same_losses(project, run_id, regression_run, f"regression, {strategy}, 2 replicas")


@pytest.mark.slow
def test_the_tfrecord_shards_hold_the_npz_digits_and_the_reader_names_its_files(project, monkeypatch):
    """What the streamed option gives the runner: the .npz's examples in order, their counts, the four files."""
    monkeypatch.syspath_prepend(str(project))
    from mylab.data import digits, digits_tfrecord

    monkeypatch.chdir(project)  # the options' paths are relative to where the command runs
    arrays, streamed = digits(), digits_tfrecord()
    assert [Path(path).name for path in streamed.train_files] == [f"train-{k:05d}-of-00004.tfrecord" for k in range(4)]
    assert (streamed.train_examples, streamed.test_examples, streamed.num_classes) == (1440, TEST_EXAMPLES, 10)
    for (images, labels), dataset in ((arrays.train, streamed.train), (arrays.test, streamed.test)):
        read = list(dataset.as_numpy_iterator())
        np.testing.assert_array_equal(np.stack([image for image, _ in read]), images)
        np.testing.assert_array_equal(np.array([label for _, label in read]), labels)


@pytest.mark.slow
def test_multi_worker_mirrored_streams_the_tfrecord_shards(project):
    """Four training shards, two workers: each worker reads its own files (auto-shard by FILE)."""
    done = runner(
        project,
        *MYLAB,
        *DIGITS_TFRECORD,
        *EPOCHS,
        "hydra.run.dir=outputs/multi_worker_tfrecord",
        "strategy=multi_worker_mirrored",
        "cluster=local",
        "batch=32",
        "mlflow.log_model=false",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logs = "".join(path.read_text() for path in (project / "outputs" / "multi_worker_tfrecord").rglob("*.log"))
    assert (
        "dataset digits: 4 files for 2 workers, each worker reads its own files (auto-shard by FILE)"
        in done.stdout + done.stderr + logs
    )
    run_id = (project / "outputs" / "multi_worker_tfrecord" / "mlflow_run_id.txt").read_text().strip()
    run = _client(project).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["num_replicas"] == "2"
    assert run.data.metrics["eval_accuracy"] > 0.8


@pytest.mark.slow
def test_parameter_server_on_a_local_cluster_trains_the_users_regression(project):
    run_id = train(
        project,
        "regression_parameter_server",
        "strategy=parameter_server",
        "cluster=local",
        "loop.steps_per_epoch=20",
        "mlflow.log_model=false",
        data=DIABETES,
    )
    assert_errors_not_accuracy(project, run_id)
    losses = _losses(project, run_id)
    assert losses[-1] < losses[0], losses
    # The coordinator's restore-and-evaluate pass scores what the last epoch's test pass scored.
    metrics = _client(project).get_run(run_id).data.metrics
    assert metrics["eval_mae"] == pytest.approx(metrics["test_mae"], rel=1e-5)


@pytest.mark.slow
def test_a_seeded_sweep_of_the_regression_chooses_the_lowest_val_mae_and_registers_a_champion(project):
    """The README's sweep over the model's own argument and the optimizer, two seeds per point, on the regression:
    with no objective given it chooses on the task's, the lowest val_mae, and registers the best job as `diabetes`."""
    sweep_dir = project / "multirun" / "hidden-optimizer"
    done = runner(
        project,
        "-m",
        *MYLAB,
        *REGRESSION,
        "epochs=1",
        "model.hidden=16,64",
        "optimizer=adam,sgd",
        "sweep.seeds=2",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        f"hydra.sweep.dir={sweep_dir.relative_to(project)}",
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    client = _client(project)
    parent_id = parent_id_of(sweep_dir)
    parent = client.get_run(parent_id)
    assert parent.data.tags["chosen_by"] == "val_mae"
    runs = children(client, parent_id)
    assert len(runs) == 8 and all(run.info.status == "FINISHED" for run in runs)
    grouped: dict[str, list] = {}
    for run in runs:
        grouped.setdefault(run.data.tags["configuration"], []).append(run)
    assert sorted(grouped) == sorted(
        f"model.hidden={hidden},optimizer={optimizer}" for hidden in (16, 64) for optimizer in ("adam", "sgd")
    )
    for group in grouped.values():
        assert sorted(run.data.params["seed"] for run in group) == ["42", "43"]
    for run in runs:  # each trained what its configuration says
        hidden, optimizer = (part.split("=")[1] for part in run.data.tags["configuration"].split(","))
        assert run.data.params["model.hidden"] == hidden
        assert run.data.params["optimizer._target_"] == f"runner.builtins.optimizers.{optimizer}"
        assert not [key for key in run.data.metrics if "accuracy" in key]

    # The champion: the best job of the best configuration, by the lowest mean val_mae over its seeds.
    means = {name: np.mean([run.data.metrics["val_mae"] for run in group]) for name, group in grouped.items()}
    best = min(means, key=means.get)
    assert parent.data.tags["best_configuration"] == best
    champion = client.get_model_version_by_alias("diabetes", "champion")
    [winner] = [run for run in grouped[best] if run.info.run_id == champion.run_id]
    assert winner.data.metrics["val_mae"] == min(run.data.metrics["val_mae"] for run in grouped[best])

    # The champion loads from the registry and predicts the raw test measurements at its run's test_mae.
    assert_predicts_at_test_mae(project, "models:/diabetes@champion", winner.data.metrics["test_mae"])

"""The `task` group: regression, binary and multi-label models trained in this process on small .npz files, their
scores checked against scikit-learn's on the same predictions and their served outputs against the trained model's;
the refusals of labels that do not fit the task."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from sklearn.metrics import f1_score, mean_absolute_error, roc_auc_score

from helpers.cli import run_cli
from helpers.config import CONF, compose
from runner.config.settings import validate
from runner.data.loading import load_data
from runner.errors import RunnerError
from runner.sweeps.sweep_config import SweepConfig
from runner.task_kinds import KINDS, TaskKind
from runner.training.task import Experiment

SIDE = 28  # the built-in CNN's two poolings need images of at least 28 pixels a side


def _images(rng: np.random.Generator, count: int) -> np.ndarray:
    return rng.integers(0, 256, size=(count, SIDE, SIDE)).astype(np.uint8)


def _write(path, labels_of, train: int = 256, test: int = 128, seed: int = 0) -> str:
    """An .npz of random images whose labels `labels_of(images)` computes: data a model can partly learn."""
    rng = np.random.default_rng(seed)
    x_train, x_test = _images(rng, train), _images(rng, test)
    np.savez(path, x_train=x_train, y_train=labels_of(x_train), x_test=x_test, y_test=labels_of(x_test))
    return str(path)


def _brightness(images: np.ndarray) -> np.ndarray:
    """Each image's mean pixel in each quarter of its rows, centred: four numbers a CNN can learn."""
    quarters = images.reshape(len(images), 4, -1).mean(axis=2) / 255.0
    return (quarters - 0.5) * 100


def regression_targets(images):
    return _brightness(images).sum(axis=1).astype(np.float32)  # one float per example


def binary_labels(images):
    return (_brightness(images)[:, 0] > 0).astype(np.int64)


def four_classes(images):
    return (_brightness(images)[:, :2] > 0).astype(np.int64) @ np.array([1, 2])  # class indices 0..3


def multilabel_labels(images):
    return (_brightness(images)[:, :3] > 0).astype(np.float32)  # three tags per example


def _settings(path: str, task: str, *overrides: str):
    args = [f"task={task}", "dataset=npz", f"dataset.path={path}", "epochs=2", "strategy=one_device", *overrides]
    return validate(OmegaConf.to_container(compose(args), resolve=True))


def _served_and_labels(settings, run_dir):
    """The served model (runner.training.task.Experiment.export_model) of the run's last checkpoint, and its
    outputs on the raw test arrays with their labels."""
    from runner.training.checkpoints import restore_without_strategy

    data = load_data(settings.dataset, settings.seed, task=settings.task.kind)
    experiment = Experiment.from_settings(settings, data.spec)
    model = restore_without_strategy(tf.train.latest_checkpoint(str(run_dir / "checkpoints")), experiment.build_model)
    served = experiment.export_model(model)
    with np.load(settings.dataset.component.arguments["path"]) as arrays:
        return served, served.predict(arrays["x_test"], verbose=0), arrays["y_test"]


def test_each_task_option_sets_its_kind_loss_metrics_and_objective_and_the_default_is_the_tutorials():
    options = {path.stem for path in (CONF / "task").glob("*.yaml")}
    assert options == set(KINDS)
    default = validate(OmegaConf.to_container(compose([]), resolve=True))
    assert (default.task.kind, default.task.objective) == ("classification", "accuracy")
    assert default.loss.target == "runner.builtins.losses.sparse_categorical_crossentropy"
    assert [(each.name, each.component.target) for each in default.metrics] == [
        ("accuracy", "tf_keras.metrics.SparseCategoricalAccuracy")
    ]
    expected = {
        "regression": ("mae", ["mae", "rmse"], "mean_squared_error"),
        "binary": ("auc", ["accuracy", "auc"], "binary_crossentropy"),
        "multilabel": ("f1", ["binary_accuracy", "auc", "f1"], "binary_crossentropy"),
    }
    for task, (objective, metrics, loss) in expected.items():
        settings = validate(OmegaConf.to_container(compose([f"task={task}"]), resolve=True))
        assert settings.task.kind == task and settings.task.objective == objective
        assert [each.name for each in settings.metrics] == metrics
        assert settings.loss.target == f"runner.builtins.losses.{loss}"
        # A sweep left to its default objective chooses on the task's score, in its direction, with no other flag.
        sweep = SweepConfig.read(compose([f"task={task}"]))
        assert sweep.objective == f"val_{objective}" and sweep.fallback_objective == f"test_{objective}"
        assert sweep.table.lower_is_better(sweep.objective, None) == (task == "regression")
    # The command line's loss wins over the task's.
    mixed = validate(OmegaConf.to_container(compose(["task=regression", "loss=binary_crossentropy"]), resolve=True))
    assert mixed.loss.target == "runner.builtins.losses.binary_crossentropy"


def test_a_regression_logs_its_errors_and_serves_the_values_it_was_scored_on(train, tmp_path):
    path = _write(tmp_path / "prices.npz", regression_targets)
    overrides = ["task=regression", "dataset=npz", f"dataset.path={path}", "epochs=2", "strategy=one_device"]
    result = train(*overrides, "dataset.validation_fraction=0.25")
    keys = set(result.final.metrics())
    assert {"train_mae", "val_mae", "test_mae", "train_rmse", "test_rmse"} <= keys
    assert not any("accuracy" in key for key in (*keys, *result.final_metrics, *result.eval_scores))
    assert result.final["test_loss"] == pytest.approx(result.final["test_rmse"] ** 2, rel=1e-4)
    assert result.eval_scores["eval_mae"] == pytest.approx(result.final["test_mae"], abs=1e-6)

    settings = _settings(path, "regression", "dataset.validation_fraction=0.25")
    served, predictions, targets = _served_and_labels(settings, tmp_path / "run")
    assert predictions.shape == (len(targets), 1) and served.output_names == ["predictions"]
    assert mean_absolute_error(targets, predictions[:, 0]) == pytest.approx(result.final["test_mae"], abs=1e-4)


@pytest.mark.slow  # two trainings and two exports in this process: about 20 s
def test_binary_auc_and_multilabel_f1_equal_scikit_learns_on_the_served_probabilities(train, tmp_path):
    for task, labels_of in (("binary", binary_labels), ("multilabel", multilabel_labels)):
        path = _write(tmp_path / f"{task}.npz", labels_of)
        run_dir = tmp_path / task
        result = train(f"task={task}", "dataset=npz", f"dataset.path={path}", "epochs=2", run_dir=run_dir)
        served, probabilities, labels = _served_and_labels(_settings(path, task), run_dir)
        assert served.output_names == ["probabilities"]
        assert ((probabilities >= 0) & (probabilities <= 1)).all()
        # The task's AUC ranks as the model ranks (runner.builtins.metrics.rank_auc): scikit-learn's exact area of
        # the served probabilities, within the bins it counts them in.
        if task == "binary":
            assert probabilities.shape == (len(labels), 1)
            assert result.final["test_auc"] == pytest.approx(roc_auc_score(labels, probabilities[:, 0]), abs=1e-3)
            accuracy = float(np.mean((probabilities[:, 0] > 0.5) == labels))
            assert result.final["test_accuracy"] == pytest.approx(accuracy, abs=1e-6)
        else:
            assert probabilities.shape == labels.shape == (len(labels), 3)
            macro = f1_score(labels, probabilities > 0.5, average="macro", zero_division=0)
            assert result.final["test_f1"] == pytest.approx(macro, abs=1e-5)
            exact = roc_auc_score(labels, probabilities, average="macro")
            assert result.final["test_auc"] == pytest.approx(exact, abs=1e-3)
        tested = {key[5:]: value for key, value in result.final.metrics().items() if key.startswith("test_")}
        assert result.eval_scores == {f"eval_{name}": value for name, value in tested.items() if name != "loss"}


@pytest.mark.parametrize(
    "task,labels_of,model_outputs,says",
    [
        (
            "classification",
            regression_targets,
            None,
            "y_train holds float32 values, not integer class indices. Fix: store labels as integers "
            "0..num_classes-1 (y.astype(np.int64)), or pass task=regression for numeric targets.",
        ),
        (
            "binary",
            regression_targets,
            None,
            "but task=binary takes one 0/1 label per example. Fix: give 0 or 1 for each label, or use "
            "task=regression for other targets.",
        ),
        (
            "binary",
            four_classes,
            None,
            "but task=binary takes one 0/1 label per example. Fix: give 0 or 1 for each label, or use "
            "task=classification for class indices (these run from 0 to 3).",
        ),
        (
            "multilabel",
            binary_labels,
            None,
            "the training labels are int64 shaped (256,), but task=multilabel takes a vector of 0/1 labels per "
            "example. Fix: give each example a vector of 0/1 labels, shaped (n, labels)",
        ),
        (
            "multilabel",
            multilabel_labels,
            5,
            "outputs shape (None, 5) for inputs (28, 28, 1), but task=multilabel's labels are shaped (3,) per "
            "example. Fix: make the model output (3,) per example",
        ),
    ],
    ids=[
        "float targets to classify",
        "targets that are not 0/1",
        "class indices as binary",
        "one label per example, multilabel",
        "width",
    ],
)
def test_labels_that_do_not_fit_the_task_are_one_paragraph(tmp_path, task, labels_of, model_outputs, says):
    path = _write(tmp_path / "data.npz", labels_of)
    model = [f"model._target_=test_tasks.dense_of_{model_outputs}", "~model.weight_decay"] if model_outputs else []
    settings = _settings(path, task, *model)
    with pytest.raises(RunnerError) as raised:
        data = load_data(settings.dataset, settings.seed, task=settings.task.kind)
        Experiment.from_settings(settings, data.spec).build_model()
    assert says in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "task_and_data,metric,says",
    [
        (  # F1Score's default average=None: one score per label
            ["task=multilabel", "dataset=npz"],
            "tf_keras.metrics.F1Score",
            "gives 3 numbers on task=multilabel (a result shaped (3,)), not one: a run logs one number per metric "
            "and epoch (`f1_per_label`). Fix: ask it for one number (F1Score and FBetaScore: "
            "+metrics.f1_per_label.average=macro, micro or weighted; with probabilities, "
            "+metrics.f1_per_label.threshold=0.5), or drop it (~metrics.f1_per_label).",
        ),
        (  # one-hot labels and probabilities, given class indices and logits
            ["dataset=synthetic", "dataset.train_examples=256", "dataset.test_examples=128"],
            "tf_keras.metrics.F1Score",
            "cannot score task=classification: updated with its labels (shaped (64,), int64) and the model's outputs "
            "(shaped (64, 10)) it raised ValueError: ",
        ),
    ],
    ids=["a score per label", "class indices"],
)
def test_a_metric_that_cannot_give_one_number_for_the_task_is_refused_before_any_run(
    tmp_path, task_and_data, metric, says
):
    path = _write(tmp_path / "data.npz", multilabel_labels)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = run_cli(
        *task_and_data,
        f"dataset.path={path}" if "dataset=npz" in task_and_data else "progress=false",
        f"+metrics.f1_per_label._target_={metric}",
        "strategy=one_device",
        f"mlflow.tracking_uri={store}",
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"error: metrics.f1_per_label={metric!r} {says}"), done.stderr
    assert not (tmp_path / "mlflow.db").exists() or not MlflowClient(store).search_runs(
        [e.experiment_id for e in MlflowClient(store).search_experiments()]
    )


def test_only_the_labels_within_the_prefixes_are_checked(tmp_path):
    """dataset.train_examples keeps the first examples: a bad target after them is not the run's to refuse."""

    def targets_with_a_bad_tail(images):
        targets = regression_targets(images)
        targets[200:] = np.nan
        return targets

    path = _write(tmp_path / "data.npz", targets_with_a_bad_tail)  # 256 training and 128 test examples
    prefixed = _settings(path, "regression", "dataset.train_examples=200")
    data = load_data(prefixed.dataset, prefixed.seed, task="regression")
    assert data.train_examples == 200 and np.all(np.isfinite(data.train_labels))
    whole = _settings(path, "regression")
    with pytest.raises(RunnerError, match="the training targets hold NaN or infinite values"):
        load_data(whole.dataset, whole.seed, task="regression")


def dense_of_5(input_shape, num_classes):
    """A model of five outputs whatever the data (model._target_=test_tasks.dense_of_5)."""
    import tf_keras

    inputs = tf_keras.Input(input_shape)
    return tf_keras.Model(inputs, tf_keras.layers.Dense(5)(tf_keras.layers.Flatten()(inputs)))


def test_the_pages_task_of_your_own_composes_as_it_says(tmp_path):
    """docs/your-own-experiment.md's task option file, copied as a user would, starts from the runner's regression
    and adds its objective's metric."""
    page = (CONF.parent / "docs" / "your-own-experiment.md").read_text()
    block = re.search(r"```yaml\n(# @package _global_\n# conf_mylab/task/relative.yaml.*?)```", page, re.S)
    assert block is not None, "the page's task option file"
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "relative.yaml").write_text(block[1])
    config = compose([f"hydra.searchpath=[file://{tmp_path}]", "task=relative"])
    settings = validate(OmegaConf.to_container(config, resolve=True))
    assert (settings.task.kind, settings.task.objective) == ("regression", "mape")
    assert [each.name for each in settings.metrics] == ["mae", "rmse", "mape"]
    assert settings.loss.target == "runner.builtins.losses.mean_squared_error"
    sweep = SweepConfig.read(config)
    assert sweep.objective == "val_mape" and sweep.table.lower_is_better("val_mape", None)


def test_a_misspelt_objective_of_the_tasks_metrics_names_the_closest():
    from runner.config.settings import sweep_settings

    with pytest.raises(RunnerError) as raised:
        sweep_settings(compose(["task=regression", "sweep.objective=val_mea"]))
    message = str(raised.value)
    assert message.startswith("sweep.objective='val_mea' is not valid")
    assert "(did you mean sweep.objective=val_mae?)" in message
    assert "\n" not in message


class Counts(TaskKind):
    """A kind of one's own, added by the test below (a subclass and a row of KINDS): whole counts of 0 or more per
    example, served as the model's values."""

    values_taken = "counts of 0 or more"
    values_fix = "store whole counts of 0 or more"
    role = "counter"

    def outside(self, values):
        return tf.logical_not(tf.math.is_finite(values)) | (values < 0) | (values != tf.floor(values))

    def _checked(self, where, split, labels, values):
        if not np.all(np.isfinite(values)) or np.any(values < 0) or np.any(values != np.floor(values)):
            raise self._refusal(where, split, labels, self.values_fix)
        return values.reshape(len(values), 1) if values.ndim == 1 else values


def counts(images):
    return np.round(np.abs(_brightness(images)[:, 0]) / 10).astype(np.float32)  # 0 to 5


@pytest.mark.slow  # two trainings in this process: about 15 s
def test_a_task_kind_of_ones_own_trains_on_arrays_and_tfrecord_files_without_touching_the_runner(
    train, tmp_path, monkeypatch
):
    """A fifth kind is a TaskKind subclass and a row of KINDS, here in the test itself: task.kind accepts it, the
    .npz loader and dataset=tfrecord's scan check its labels by its own rules, and it trains on both."""
    from helpers.data import tfrecord_options, write_tfrecords

    monkeypatch.setitem(
        KINDS, "counts", Counts("counts", "whole counts of 0 or more per example", None, False, "MeanAbsoluteError")
    )
    own = ["task=regression", "task.kind=counts", "epochs=1", "strategy=one_device"]
    path = _write(tmp_path / "counts.npz", counts)
    on_arrays = train(*own, "dataset=npz", f"dataset.path={path}", run_dir=tmp_path / "arrays")
    assert np.isfinite(on_arrays.final["test_mae"]) and on_arrays.final["test_mae"] < 5

    records = tmp_path / "records"
    records.mkdir()
    for prefix, files in (("train", 2), ("test", 1)):
        write_tfrecords(records, prefix, files, 64, labels=lambda image: [float(counts(image[None])[0])])
    on_files = train(*own, *tfrecord_options(records), run_dir=tmp_path / "files")
    assert np.isfinite(on_files.final["test_mae"])

    negative = tmp_path / "negative"
    negative.mkdir()
    for prefix, files in (("train", 2), ("test", 1)):
        write_tfrecords(negative, prefix, files, 64, labels=lambda image: [-1.0])
    with pytest.raises(RunnerError, match=r"label value\(s\) that are not counts of 0 or more .* task=counts takes"):
        train(*own, *tfrecord_options(negative), run_dir=tmp_path / "refused")
    with pytest.raises(RunnerError, match=r"task=counts takes whole counts of 0 or more per example"):
        train(*own, "dataset=npz", f"dataset.path={_write(tmp_path / 'bad.npz', lambda x: counts(x) - 0.5)}")

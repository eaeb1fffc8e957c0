"""The one metric table (runner.metric_table): the keys a run logs, and each one's direction, known for every
Keras metric of both Kerases and overridden by a sweep's direction."""

from __future__ import annotations

import inspect

import pytest
from omegaconf import OmegaConf

from runner.config.objective import agreed_direction
from runner.config.settings import objective_of
from runner.errors import RunnerError
from runner.metric_table import DEFAULT_TABLE, MAXIMIZE, MINIMIZE, Metric, MetricTable, keras_direction
from runner.sweeps.sweep_config import SweepConfig
from runner.task_kinds import KINDS

# Keras' metrics that need arguments to be made, and those that average whatever they are given (no direction).
_ARGUMENTS = {
    "IoU": {"num_classes": 2, "target_class_ids": [0]},
    "MeanIoU": {"num_classes": 2},
    "OneHotIoU": {"num_classes": 2, "target_class_ids": [0]},
    "OneHotMeanIoU": {"num_classes": 2},
    "MeanRelativeError": {"normalizer": [1.0]},
    "PrecisionAtRecall": {"recall": 0.5},
    "RecallAtPrecision": {"precision": 0.5},
    "SensitivityAtSpecificity": {"specificity": 0.5},
    "SpecificityAtSensitivity": {"sensitivity": 0.5},
}
_GENERIC = ("Mean", "Sum", "MeanTensor", "MeanMetricWrapper", "Metric", "Reduce")
_LOWER = ("MeanAbsoluteError", "RootMeanSquaredError", "BinaryCrossentropy", "KLDivergence", "LogCoshError", "Hinge")
_HIGHER = ("AUC", "Precision", "Recall", "F1Score", "MeanIoU", "BinaryIoU", "R2Score", "SparseTopKCategoricalAccuracy")


def test_the_default_table_lists_what_a_run_has_always_logged_in_the_order_the_summaries_show_it():
    assert DEFAULT_TABLE.result_keys == (
        "train_loss",
        "train_accuracy",
        "val_loss",
        "val_accuracy",
        "test_loss",
        "test_accuracy",
        "eval_accuracy",
        "examples_per_second",
        "parameters",
        "trainable_parameters",
        "model_bytes",
        "latency_ms",
        "served_examples_per_second",
        "training_seconds",
    )
    assert DEFAULT_TABLE.epoch_keys(validation=False) == ("train_loss", "train_accuracy", "test_loss", "test_accuracy")
    assert DEFAULT_TABLE.per_epoch_keys[-1] == "examples_per_second"
    assert "eval_accuracy" not in DEFAULT_TABLE.per_epoch_keys  # only once training has ended
    assert DEFAULT_TABLE.curve_keys("val") == ("val_accuracy", "val_loss", "train_loss")


@pytest.mark.parametrize("module", ["tf_keras.metrics", "keras.metrics"])
def test_every_keras_metric_of_both_kerases_has_a_known_direction_by_the_name_it_logs_under(module):
    metrics = pytest.importorskip(module)
    checked = {}
    for name, cls in vars(metrics).items():
        if not inspect.isclass(cls) or not issubclass(cls, metrics.Metric) or name in _GENERIC:
            continue
        logged = cls(**_ARGUMENTS.get(name, {})).name
        checked[name] = keras_direction(logged)
        assert checked[name] is not None, f"{module}.{name} logs as {logged!r}, whose direction the table lacks"
    assert len(checked) >= 35
    assert {checked[name] for name in _LOWER} == {MINIMIZE}
    assert {checked[name] for name in _HIGHER} == {MAXIMIZE}
    assert keras_direction("mean") is None  # a Mean averages anything: its direction is the user's to say


def test_a_direction_is_the_metrics_own_unless_the_sweep_overrides_it_and_an_unknown_key_is_one_paragraph():
    table = MetricTable.of([Metric.of("mae"), Metric.of("r2_score"), Metric.of("spread", "minimize")])
    assert table.result_keys[:3] == ("train_loss", "train_mae", "train_r2_score")
    assert "eval_mae" in table.result_keys and "eval_loss" not in table.result_keys
    assert table.lower_is_better("val_mae") and not table.lower_is_better("eval_r2_score")
    assert table.lower_is_better("test_spread") and not table.lower_is_better("examples_per_second")
    # What the model costs: lower is better but for how many examples the served model answers each second.
    costs = ("parameters", "trainable_parameters", "model_bytes", "latency_ms", "training_seconds")
    assert all(table.lower_is_better(key) for key in costs)
    assert not table.lower_is_better("served_examples_per_second")
    assert not table.lower_is_better("val_loss", "maximize")  # sweep.direction wins
    assert DEFAULT_TABLE.lower_is_better("val_loss") and not DEFAULT_TABLE.lower_is_better("val_accuracy")
    with pytest.raises(RunnerError, match=r"^val_mea is not a metric this run logs \(train_loss, .*val_mae.*\)"):
        table.direction("val_mea")
    with pytest.raises(RunnerError, match=r"^sweep.direction='up' is not valid: .* Fix: pass sweep.direction=min"):
        table.direction("val_mae", "up")
    with pytest.raises(RunnerError, match=r"^metrics.spread has no known direction: .* Fix: add metrics.spread.dir"):
        Metric.of("spread")


def test_a_sweeps_direction_is_its_sweepers_or_its_own_and_they_must_agree():
    from helpers.config import compose

    assert agreed_direction(None, None) is None
    assert agreed_direction("minimize", None) == agreed_direction(None, "minimize") == "minimize"
    with pytest.raises(RunnerError, match=r"^hydra.sweeper.direction=maximize is not valid with sweep.direction=min"):
        agreed_direction("maximize", "minimize")
    assert SweepConfig.read(compose(["sweep.objective=val_loss"])).lower_is_better  # a loss, with no flag
    against = ["sweep.objective=val_loss", "sweep.direction=maximize", "sweep.direction_against_metric=true"]
    chosen = SweepConfig.read(compose(against))
    assert (chosen.lower_is_better, chosen.worst) == (False, float("-inf"))


@pytest.mark.parametrize(
    "overrides, sweeper, named",
    [
        (["task=regression", "sweep.direction=maximize"], None, "sweep.direction=maximize is not valid for the "),
        (["sweep.objective=val_accuracy"], "minimize", "hydra.sweeper.direction=minimize is not valid for the "),
        (["sweep.objective=test_loss", "sweep.direction=maximize"], None, "sweep.direction=maximize is not valid"),
    ],
)
def test_a_direction_against_the_objectives_own_is_refused_unless_meant(overrides, sweeper, named):
    """Maximizing an error or a loss, or minimizing an accuracy, would choose the worst configuration and register
    it: one paragraph naming the key, unless sweep.direction_against_metric=true; the same direction is accepted."""
    from helpers.config import compose

    hydra = OmegaConf.create({"sweeper": {"direction": sweeper}})
    with pytest.raises(RunnerError) as raised:
        SweepConfig.read(compose(overrides), hydra)
    message = str(raised.value)
    assert message.startswith(named) and "would choose the worst configuration" in message, message
    assert "Fix: drop" in message and "sweep.direction_against_metric=true" in message and "\n" not in message
    meant = SweepConfig.read(compose([*overrides, "sweep.direction_against_metric=true"]), hydra)
    assert meant.lower_is_better == (sweeper == "minimize")
    assert SweepConfig.read(compose(["task=regression", "sweep.direction=minimize"])).lower_is_better


def test_an_optuna_study_minimizes_a_loss_objective_with_no_direction_given():
    from helpers.config import compose

    def study_direction(*overrides: str) -> str:
        return objective_of(compose(list(overrides))).study_direction

    assert study_direction("sweep.objective=val_loss") == "minimize"
    assert study_direction() == "maximize"  # val_accuracy
    against = ["sweep.objective=val_loss", "sweep.direction=maximize", "sweep.direction_against_metric=true"]
    assert study_direction(*against) == "maximize"
    loss = compose(["sweep.objective=val_loss"])
    assert objective_of(loss, {"sweeper": {"direction": "minimize"}}).study_direction == "minimize"
    with pytest.raises(RunnerError, match=r"^hydra.sweeper.direction='sideways' is not valid"):
        objective_of(compose([]), {"sweeper": {"direction": "sideways"}})


TOP5 = ("+metrics.top5._target_=tf_keras.metrics.SparseTopKCategoricalAccuracy", "+metrics.top5.k=5")


def _validated(*overrides: str):
    from helpers.config import compose
    from runner.config.settings import checked_targets, validate

    return checked_targets(validate(OmegaConf.to_container(compose(list(overrides)), resolve=True)))


def test_a_metric_added_on_the_command_line_joins_the_table_and_can_be_the_sweeps_objective():
    settings = _validated(*TOP5, "sweep.objective=val_top5", "early_stopping.monitor=val_top5")
    assert [each.name for each in settings.metrics] == ["accuracy", "top5"]
    assert settings.metrics[1].component.arguments == {"k": 5}
    assert "eval_top5" in settings.metric_table.result_keys
    assert not settings.metric_table.lower_is_better("val_top5")  # its class's name: an accuracy
    spread = _validated("+metrics.spread._target_=tf_keras.metrics.Mean", "+metrics.spread.direction=min")
    assert spread.metric_table.lower_is_better("test_spread") and spread.metrics[1].component.arguments == {}
    assert [each.name for each in _validated("~metrics.accuracy", *TOP5, "task.objective=top5").metrics] == ["top5"]


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        (("sweep.objective=val_top5",), r"^sweep.objective='val_top5' is not valid: a sweep job can only return one"),
        ((*TOP5, "sweep.objective=val_top"), r"^sweep.objective='val_top' is not valid: .*did you mean "),
        (("early_stopping.monitor=eval_accuracy",), r"^early_stopping.monitor='eval_accuracy' is not valid: it must"),
        (("+metrics.spread._target_=tf_keras.metrics.Mean",), r"^metrics.spread \(tf_keras.metrics.Mean\) has no kno"),
        (("+metrics.spread._target_=tf_keras.metrics.Mean", "+metrics.spread.direction=up"), r"^metrics.spread.dire"),
        (  # the fix's example is a metric class, not a model builder
            ("+metrics.top5._target_=tf_keras.metrics.NoSuchMetric",),
            r"metrics.top5._target_=.*NoSuchMetric.* Fix: .*e.g. metrics.top5._target_=tf_keras.metrics.AUC,",
        ),
        ((*TOP5[:1], "+metrics.top5.kk=5"), r"metrics.top5.kk is not valid: .*takes no argument 'kk'"),
        (("+metrics.Top5._target_=tf_keras.metrics.AUC",), r"^metrics.Top5=.* is not valid: a score's name is lower"),
        (("+metrics.loss._target_=tf_keras.metrics.AUC",), r"^metrics.loss=.* is not valid: .*not loss, the run's"),
        (("+metrics.auc=5",), r"^metrics.auc=5 is not valid: it must name a Keras metric by its _target_"),
    ],
)
def test_a_bad_metric_is_one_paragraph_naming_it_and_the_fix(overrides, refused):
    with pytest.raises(RunnerError, match=refused) as error:
        _validated(*overrides)
    assert "Fix: " in str(error.value)


@pytest.mark.parametrize(
    ("task", "target", "suits"),
    [
        ("regression", "tf_keras.metrics.SparseCategoricalAccuracy", "MeanAbsoluteError"),
        ("regression", "tf_keras.metrics.AUC", "RootMeanSquaredError"),
        ("binary", "tf_keras.metrics.SparseTopKCategoricalAccuracy", "rank_auc"),
        ("multilabel", "tf_keras.metrics.SparseCategoricalAccuracy", "F1Score"),
        ("classification", "tf_keras.metrics.BinaryAccuracy", "SparseCategoricalAccuracy"),
    ],
)
def test_a_metric_known_not_to_suit_the_task_is_refused_with_the_metrics_that_do(task, target, suits):
    with pytest.raises(RunnerError) as error:
        _validated(f"task={task}", f"+metrics.odd._target_={target}")
    said = str(error.value)
    assert said.startswith(f"metrics.odd={target!r} is not valid: it does not suit task={task} ("), said
    assert f"Fix: drop it (~metrics.odd) or use a metric that suits task={task}: " in said and suits in said
    assert error.value.key == "metrics.odd._target_" and "\n" not in said


def test_the_metrics_each_task_ships_suit_it_and_a_users_own_class_is_not_judged_by_its_name():
    for task in ("classification", "regression", "binary", "multilabel"):
        _validated(f"task={task}")
    # A class of one's own named like an accuracy is the user's to judge.
    assert KINDS["regression"].unsuitable("mylab.metrics.WithinAccuracy", "within_accuracy") is None
    assert KINDS["regression"].unsuitable("keras.metrics.BinaryAccuracy", "binary_accuracy") is not None


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        (
            ("task=binary", "task.objective=roc"),
            r"^task.objective='roc' is not valid: a sweep chooses on val_<it> .*auc",
        ),
        (
            ("task.objective=acuracy",),
            r"^task.objective='acuracy' is not valid: .*did you mean task.objective=accuracy",
        ),
        (
            ("early_stopping.patience=2", "early_stopping.monitor=test_loss"),
            r"^early_stopping.monitor='test_loss' is not valid: it watches the test set",
        ),
    ],
)
def test_a_key_that_names_a_metric_is_checked_where_it_is_composed(overrides, refused):
    with pytest.raises(RunnerError, match=refused) as error:
        _validated(*overrides)
    assert "Fix: " in str(error.value)

"""Every number a run logs, in one table: which metrics a run has after each epoch and at its end, and whether
lower or higher is better for each. The epoch result, the outcome a sweep job returns, the config's choices of
`sweep.objective` and `early_stopping.monitor`, the pruner's reports, the summaries, the report's columns and
curves and the registry's comparison all read it; none lists metric names or guesses a direction of its own.

A run's metrics are its loss and its scores (`accuracy` by default), each logged per epoch on the training set
(`train_<name>`), the validation split (`val_<name>`, where the run has one) and the test set (`test_<name>`); each
score once more as `eval_<name>`, the model restored without a strategy and evaluated; `examples_per_second`; and
what the trained model costs (COST), once at the end of the run: its parameters, the exported model's size, the
served model's latency per example and examples per second, and the seconds it trained.
A direction is known: Keras' own metrics by the names they log under (below), and a sweep's override
(`sweep.direction`, or the Optuna sweeper's `hydra.sweeper.direction`) before it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runner.errors import RunnerError

MINIMIZE, MAXIMIZE = "minimize", "maximize"  # Optuna's words, and sweep.direction's
DIRECTIONS = (MINIMIZE, MAXIMIZE)
SPLITS = ("train", "val", "test")  # the per-epoch passes, in the order they are logged
EVAL = "eval"  # the restored model's pass over the test set, once training has ended
THROUGHPUT = "examples_per_second"
# What the trained model costs (runner.training.cost; model_bytes: runner.training.actions.LogModel), each logged once
# at the end of a run at the step of the model's epoch.
PARAMETERS = "parameters"  # every weight of the model (model.count_params())
TRAINABLE_PARAMETERS = "trainable_parameters"
MODEL_BYTES = "model_bytes"  # the exported model's files (the logged MLflow Model), in bytes
LATENCY_MS = "latency_ms"  # the served model's milliseconds per example at a batch of cost.latency_batch
SERVED_EXAMPLES_PER_SECOND = "served_examples_per_second"  # the same measurement as examples per second
TRAINING_SECONDS = "training_seconds"  # the seconds the run's epochs took to train

# Keras' metrics by the names they log under (their `name`, the snake_case of their class), and the endings the
# rest of Keras' names share: errors, divergences and losses are lower-better, the scores higher-better.
_KERAS_DIRECTIONS = {
    **dict.fromkeys(
        (
            "loss",
            "mae",
            "mse",
            "rmse",
            "mape",
            "msle",
            "hinge",
            "squared_hinge",
            "categorical_hinge",
            "logcosh",
            "log_cosh",
            "kl_divergence",
            "kld",
            "kullback_leibler_divergence",
            "poisson",
            "false_positives",
            "false_negatives",
        ),
        MINIMIZE,
    ),
    **dict.fromkeys(
        (
            "auc",
            "prc",
            "precision",
            "recall",
            "f1",
            "f1_score",
            "fbeta_score",
            "iou",
            "mean_iou",
            "one_hot_iou",
            "one_hot_mean_iou",
            "binary_iou",
            "r2_score",
            "cosine_similarity",
            "pearson_correlation",
            "concordance_correlation",
            "true_positives",
            "true_negatives",
            "precision_at_recall",
            "recall_at_precision",
            "sensitivity_at_specificity",
            "specificity_at_sensitivity",
        ),
        MAXIMIZE,
    ),
}
_KERAS_ENDINGS = (
    ("accuracy", MAXIMIZE),
    ("io_u", MAXIMIZE),  # IoU, MeanIoU, BinaryIoU, OneHotIoU: binary_io_u, mean_io_u, ...
    ("_error", MINIMIZE),
    ("_crossentropy", MINIMIZE),
    ("_loss", MINIMIZE),
    ("_divergence", MINIMIZE),
)


def snake_case(class_name: str) -> str:
    """A Keras metric class's name as the metric logs under by default: SparseTopKCategoricalAccuracy ->
    sparse_top_k_categorical_accuracy, AUC -> auc, MeanIoU -> mean_io_u."""
    words = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", class_name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", words).lower()


def keras_direction(name: str) -> str | None:
    """Whether lower (MINIMIZE) or higher (MAXIMIZE) is better for the Keras metric logged as `name`, None where
    Keras has no such metric."""
    if name in _KERAS_DIRECTIONS:
        return _KERAS_DIRECTIONS[name]
    return next((direction for ending, direction in _KERAS_ENDINGS if name.endswith(ending)), None)


@dataclass(frozen=True)
class Metric:
    """One metric of the model: its name (`accuracy`, `loss`) and whether lower or higher is better."""

    name: str
    direction: str

    @classmethod
    def of(cls, name: str, direction: str | None = None, target: str | None = None) -> Metric:
        """`name` with the direction given, else Keras' for its name or for its class (`target`, the dotted path
        of a Keras metric class); a RunnerError where none is known."""
        known = direction or keras_direction(name)
        if known is None and target is not None:
            known = keras_direction(snake_case(target.rpartition(".")[2]))
        if known not in DIRECTIONS:
            made = f" ({target})" if target else ""
            raise RunnerError(
                f"metrics.{name}{made} has no known direction: whether lower or higher is better cannot be told from "
                f"its name or its class. Fix: add metrics.{name}.direction=max (a score) or min (an error).",
                key=f"metrics.{name}.direction",
            )
        return cls(name, str(known))


# Lower is better for each cost but the served model's examples per second. A run that logs no model (mlflow.log_model
# false, a sweep's trial under sweep.trial_models=champion) has no model_bytes.
COST = (
    Metric(PARAMETERS, MINIMIZE),
    Metric(TRAINABLE_PARAMETERS, MINIMIZE),
    Metric(MODEL_BYTES, MINIMIZE),
    Metric(LATENCY_MS, MINIMIZE),
    Metric(SERVED_EXAMPLES_PER_SECOND, MAXIMIZE),
    Metric(TRAINING_SECONDS, MINIMIZE),
)
COST_KEYS = tuple(metric.name for metric in COST)
_COST_DIRECTIONS = {metric.name: metric.direction for metric in COST}
# How the summaries and the report write a number: counts whole, speeds and seconds to a tenth, the latency in
# milliseconds to a thousandth, every other metric to four decimals.
_FORMATS = {
    **dict.fromkeys((PARAMETERS, TRAINABLE_PARAMETERS, MODEL_BYTES), ".0f"),
    **dict.fromkeys((THROUGHPUT, SERVED_EXAMPLES_PER_SECOND, TRAINING_SECONDS), ".1f"),
    LATENCY_MS: ".3f",
}


def formatted(key: str, value: float) -> str:
    """`value` of the logged metric `key` as the summaries and the report write it."""
    return format(value, _FORMATS.get(key, ".4f"))


@dataclass(frozen=True)
class MetricTable:
    """The run's loss and scores, and every key a run logs from them."""

    scores: tuple[Metric, ...] = (Metric("accuracy", MAXIMIZE),)

    @classmethod
    def of(cls, scores: Iterable[Metric]) -> MetricTable:
        return cls(tuple(scores))

    @property
    def model_metrics(self) -> tuple[Metric, ...]:
        """The loss, then the scores: what each per-epoch pass measures."""
        return (Metric("loss", MINIMIZE), *self.scores)

    def split_keys(self, split: str) -> tuple[str, ...]:
        """`split`'s scores, then its loss (`test_accuracy`, `test_loss`): what a split's results show first."""
        return (*(f"{split}_{metric.name}" for metric in self.scores), f"{split}_loss")

    def epoch_keys(self, validation: bool = True) -> tuple[str, ...]:
        """What a run logs after each epoch about its model, by split (val_* only with a validation split)."""
        splits = SPLITS if validation else tuple(split for split in SPLITS if split != "val")
        return tuple(f"{split}_{metric.name}" for split in splits for metric in self.model_metrics)

    @property
    def per_epoch_keys(self) -> tuple[str, ...]:
        """Every metric a run has after each epoch: what a pruner can compare."""
        return (*self.epoch_keys(), THROUGHPUT)

    @property
    def eval_keys(self) -> tuple[str, ...]:
        """The restored model's scores on the test set, once training has ended."""
        return tuple(f"{EVAL}_{metric.name}" for metric in self.scores)

    @property
    def result_keys(self) -> tuple[str, ...]:
        """The numbers a finished run holds, in the order the summaries show them: any can be a sweep's objective.
        Its outcome holds them but val_* without a validation split and model_bytes, logged after it with the
        model."""
        return (*self.epoch_keys(), *self.eval_keys, THROUGHPUT, *COST_KEYS)

    def curve_keys(self, split: str) -> tuple[str, ...]:
        """The curves a figure draws per epoch: `split`'s scores and loss, and the training loss."""
        return (*self.split_keys(split), "train_loss")

    def direction(self, key: str, override: Any = None) -> str:
        """MINIMIZE or MAXIMIZE for the logged `key`; `override` (sweep.direction, hydra.sweeper.direction, an enum
        or its name) wins when given."""
        given = getattr(override, "name", override)
        if given is not None:
            if given not in DIRECTIONS:
                raise RunnerError(
                    f"sweep.direction={given!r} is not valid: the objective is either minimized or maximized. Fix: "
                    "pass sweep.direction=minimize or maximize, or null for the objective's own."
                )
            return str(given)
        if key == THROUGHPUT:
            return MAXIMIZE
        if key in _COST_DIRECTIONS:
            return _COST_DIRECTIONS[key]
        split, _, name = key.partition("_")
        found = next((m.direction for m in self.model_metrics if m.name == name), None)
        if split not in (*SPLITS, EVAL) or found is None:
            raise RunnerError(
                f"{key} is not a metric this run logs ({', '.join(self.result_keys)}), so whether lower or higher "
                "is better is not known. Fix: name one of those, or add the metric under `metrics`."
            )
        return found

    def check_direction(self, key: str, given: Any, named: str, against: bool) -> None:
        """A direction `given` for the objective `key` (by `named`: sweep.direction or hydra.sweeper.direction) that
        goes against the table's own is refused, unless `against` (sweep.direction_against_metric) says it is meant:
        maximizing an error or minimizing an accuracy would choose the worst configuration and register it."""
        given = getattr(given, "name", given)
        if given is None or against or given not in DIRECTIONS:
            return
        own = self.direction(key)
        if given == own:
            return
        better = "lower" if own == MINIMIZE else "higher"
        metric = key.partition("_")[2]
        raise RunnerError(
            f"{named}={given} is not valid for the objective {key}: {better} is better for {key} (the run's metric "
            f"table: {self.as_text()}), so {given} would choose the worst configuration and register it. Fix: drop "
            f"{named} (null: the objective's own direction), or, if {given} is meant, add "
            f"sweep.direction_against_metric=true (for a metric of your own whose direction the table has wrong, "
            f"declare it instead: +metrics.{metric}.direction=max or min).",
            key=named,
        )

    def lower_is_better(self, key: str, override: Any = None) -> bool:
        return self.direction(key, override) == MINIMIZE

    def as_text(self) -> str:
        """The scores and their directions in one line (`mae:minimize,rmse:minimize`): what a sweep's parent run
        records, so that its report can be written where its config is not (MetricTable.from_text)."""
        return ",".join(f"{metric.name}:{metric.direction}" for metric in self.scores)

    @classmethod
    def from_text(cls, text: str) -> MetricTable:
        """The table as_text wrote."""
        pairs = [item.partition(":") for item in text.split(",") if item]
        return cls.of(Metric(name, direction) for name, _, direction in pairs)


# The runner's own experiment: loss and accuracy (the tutorial's).
DEFAULT_TABLE = MetricTable()

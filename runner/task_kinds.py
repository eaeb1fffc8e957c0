"""The kinds of prediction a run trains (the `task` group's `task.kind`): what its labels are, what its model outputs
and what its logged model serves. The data layer checks and shapes labels by them (runner.data.loading), the
training task checks the model's output and adds the served model's last layer (runner.training.task).

The loss, the metrics and the score a sweep chooses on by default are not here: each task's option file
(conf/task/<kind>.yaml) sets them as config, so that a user's own option may change any of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from runner.errors import RunnerError

if TYPE_CHECKING:
    import numpy as np

# NumPy is imported where labels are read: the config's checks read the kinds' names before a command line is
# accepted, in a process that must answer in well under a second.


@dataclass(frozen=True)
class TaskKind:
    """A kind of target: numeric labels (float32 targets shaped like the model's output for one example), checked
    by each kind's `_checked`; the classification overrides what differs for class indices."""

    # Its labels are class indices, counted by num_classes, and its model outputs one logit per class
    # (Classification); otherwise they are numbers shaped like the model's output for one example.
    class_indices: ClassVar[bool] = False
    # What the values of a label must be, and what to do about one that is not, in the words of a stream's refusal
    # (dataset=tfrecord's scan counts the values `outside` returns).
    values_taken: ClassVar[str] = "finite numbers"
    values_fix: ClassVar[str] = "drop or fill those examples"
    # What the served model is called after (`<data>_<role>`).
    role: ClassVar[str] = "predictor"

    name: str
    labels: str  # what one example's label is, in the words of a refusal
    activation: str | None  # the served model's last layer on the model's outputs: softmax, sigmoid, or none
    stratified: bool  # whether validation splits and folds keep each label's share
    suitable_metrics: str = ""  # the metrics that suit it, in the words of a refusal
    # The Keras and runner metrics known not to suit it: (a pattern of the snake_case name of the metric's class or
    # function, why), checked against the `metrics` config before anything trains (runner.config.settings).
    unsuitable_metrics: tuple[tuple[str, str], ...] = ()

    def unsuitable(self, target: str, name: str) -> str | None:
        """Why the metric `target` (a dotted path; `name`: its class's or function's in snake_case,
        runner.metric_table.snake_case) does not suit this kind, or None: it suits, or it is a user's own, which the
        runner cannot judge by its name."""
        if not target.startswith(_JUDGED_MODULES):
            return None
        return next((why for pattern, why in self.unsuitable_metrics if re.search(pattern, name)), None)

    def strata(self, labels: np.ndarray) -> np.ndarray:
        """One key per example that a validation split or a fold keeps the shares of: its label where the labels
        are classes, else one stratum (drawn at random)."""
        import numpy as np  # noqa: PLC0415  see the import note above

        if self.stratified:
            return labels.reshape(len(labels)).astype(np.int64)
        return np.zeros(len(labels), np.int64)

    def prepare(self, where: str, split: str, labels: np.ndarray) -> np.ndarray:
        """The labels of one split as the loop feeds them (float32 targets shaped like the model's output for one
        example), or one paragraph saying what is wrong with them."""
        import numpy as np  # noqa: PLC0415  see the import note above

        if not (np.issubdtype(labels.dtype, np.number) or labels.dtype == np.bool_) or labels.ndim < 1:
            raise self._refusal(where, split, labels, "give numeric labels")
        return self._checked(where, split, labels, labels.astype(np.float32))

    def output_shape(self, labels: np.ndarray, num_classes: int | None) -> tuple[int, ...]:
        """What the model outputs for one example, given prepared labels (and the number of classes of a
        classification)."""
        return tuple(int(size) for size in labels.shape[1:])

    def stream_outputs(self, where: str, label_shape: tuple[int, ...], numeric: bool) -> tuple[int, ...]:
        """What the model outputs for one example of a stream (files or a tf.data dataset) whose labels are
        `label_shape` per example, of a numeric dtype or not (a classification's stream outputs are its
        num_classes); or one paragraph saying what is wrong with them. A stream's values are checked where the
        runner reads them ahead (dataset=tfrecord's scan), not here."""
        fix = self._shape_fix(label_shape) if numeric else "give numeric labels (integers or floats)"
        if fix is None:
            return label_shape if len(label_shape) else (1,)
        described = f"{'numeric' if numeric else 'non-numeric'} labels shaped {list(label_shape)} per example"
        raise RunnerError(
            f"{where}: the stream gives {described}, but task={self.name} takes {self.labels}. Fix: {fix}, or "
            "pick the task that matches the labels (task=classification, regression, binary or multilabel)."
        )

    def outside(self, values: Any) -> Any:
        """Which of a stream's label values (a float64 tf.Tensor) this kind does not take: a boolean tensor, as
        dataset=tfrecord's scan counts them per file. A number that is not finite, unless a kind says otherwise."""
        import tensorflow as tf  # noqa: PLC0415  TensorFlow: only where a stream is scanned

        return tf.logical_not(tf.math.is_finite(values))

    def _checked(self, where: str, split: str, labels: np.ndarray, values: np.ndarray) -> np.ndarray:
        """`values` (the labels as float32) checked and shaped for this kind."""
        raise NotImplementedError

    def _shape_fix(self, label_shape: tuple[int, ...]) -> str | None:
        """What to do about labels of this shape per example; None: they fit."""
        return None

    def _refusal(self, where: str, split: str, labels: np.ndarray, fix: str) -> RunnerError:
        return RunnerError(
            f"{where}: the {split} labels are {labels.dtype} shaped {labels.shape}, but task={self.name} takes "
            f"{self.labels}. Fix: {fix}, or pick the task that matches the labels (task=classification, "
            "regression, binary or multilabel)."
        )


class Classification(TaskKind):
    """One integer class index per example; the model outputs num_classes logits."""

    class_indices = True
    values_taken = "class indices"
    values_fix = "store class indices 0..num_classes-1"
    role = "classifier"

    def prepare(self, where: str, split: str, labels: np.ndarray) -> np.ndarray:
        """int64 class indices (their range is checked against num_classes by the data layer)."""
        import numpy as np  # noqa: PLC0415  see the import note above

        if labels.ndim != 1:
            fix = "give one class index per example (labels.argmax(axis=1) of one-hot labels)"
            raise self._refusal(where, split, labels, fix)
        if not np.issubdtype(labels.dtype, np.integer):
            raise self._refusal(where, split, labels, "give integer class indices 0..num_classes-1")
        return labels.astype(np.int64)

    def output_shape(self, labels: np.ndarray, num_classes: int | None) -> tuple[int, ...]:
        assert num_classes is not None
        return (num_classes,)

    def stream_outputs(self, where: str, label_shape: tuple[int, ...], numeric: bool) -> tuple[int, ...]:
        raise AssertionError("a classification's stream outputs are its num_classes")


class Regression(TaskKind):
    """Finite numbers of any shape per example (a scalar becomes (1,))."""

    values_taken = "finite targets"
    role = "regressor"

    def _checked(self, where: str, split: str, labels: np.ndarray, values: np.ndarray) -> np.ndarray:
        import numpy as np  # noqa: PLC0415  see the import note above

        if not np.all(np.isfinite(values)):
            raise RunnerError(
                f"{where}: the {split} targets hold NaN or infinite values. Fix: drop or fill those examples."
            )
        return values.reshape(len(values), 1) if values.ndim == 1 else values


class ZeroOrOne(TaskKind):
    """Labels of 0 or 1: what a stream's scan refuses of them."""

    values_taken = "0/1 labels"
    values_fix = "store 0 or 1 for each label"

    def outside(self, values: Any) -> Any:
        return (values != 0) & (values != 1)


class Binary(ZeroOrOne):
    """One 0/1 label per example, shaped (1,)."""

    role = "classifier"

    def _checked(self, where: str, split: str, labels: np.ndarray, values: np.ndarray) -> np.ndarray:
        if values.ndim > 2 or (values.ndim == 2 and values.shape[1] != 1):
            raise self._refusal(where, split, labels, "give one 0/1 label per example, or use task=multilabel")
        return _zero_or_one(self, where, split, values.reshape(len(values), 1))

    def _shape_fix(self, label_shape: tuple[int, ...]) -> str | None:
        return None if label_shape in ((), (1,)) else "give one 0/1 label per example, or use task=multilabel"


class Multilabel(ZeroOrOne):
    """A vector of 0/1 labels per example."""

    role = "tagger"

    def _checked(self, where: str, split: str, labels: np.ndarray, values: np.ndarray) -> np.ndarray:
        if values.ndim != 2:
            raise self._refusal(where, split, labels, "give each example a vector of 0/1 labels, shaped (n, labels)")
        return _zero_or_one(self, where, split, values)

    def _shape_fix(self, label_shape: tuple[int, ...]) -> str | None:
        return None if len(label_shape) == 1 else "give each example a vector of 0/1 labels, shaped [labels]"


def _zero_or_one(kind: TaskKind, where: str, split: str, values: np.ndarray) -> np.ndarray:
    outside = values[(values != 0) & (values != 1)]
    if outside.size:
        raise RunnerError(
            f"{where}: the {split} labels hold {outside[0]:g}, but task={kind.name} takes {kind.labels}. "
            f"Fix: give 0 or 1 for each label, or {_task_for(values)}."
        )
    return values


def _task_for(values: np.ndarray) -> str:
    """The task whose labels `values` look like: class indices (whole numbers from 0) or numeric targets."""
    import numpy as np  # noqa: PLC0415  see the import note above

    finite = values[np.isfinite(values)]
    if finite.size and finite.min() >= 0 and np.all(finite == np.floor(finite)):
        return f"use task=classification for class indices (these run from 0 to {finite.max():g})"
    return "use task=regression for other targets"


# The modules whose metrics a kind judges by name (a user's own metric class is theirs to judge).
_JUDGED_MODULES = ("tf_keras.", "keras.", "tensorflow.keras.", "runner.builtins.")
_ZERO_ONE_SCORES = r"(^|_)auc$|precision|recall|f1_score$|fbeta_score$|^(true|false)_(positives|negatives)$|io_u$"

KINDS: dict[str, TaskKind] = {
    kind.name: kind
    for kind in (
        Classification(
            "classification",
            "one integer class index per example",
            "softmax",
            True,
            "tf_keras.metrics.SparseCategoricalAccuracy or SparseTopKCategoricalAccuracy (with k)",
            (
                (
                    r"^binary_(accuracy|crossentropy)$|(^|_)auc$",
                    "it scores 0/1 labels against one probability each, and a classification's labels are class "
                    "indices and its outputs one logit per class",
                ),
            ),
        ),
        Regression(
            "regression",
            "numeric targets of any shape per example",
            None,
            False,
            "tf_keras.metrics.MeanAbsoluteError, RootMeanSquaredError, MeanSquaredError, MeanAbsolutePercentageError "
            "or R2Score",
            (
                (
                    r"accuracy$",
                    "an accuracy counts predictions that equal their label as a class, and a regression's "
                    "labels and outputs are numbers",
                ),
                (
                    _ZERO_ONE_SCORES,
                    "it scores 0/1 labels against probabilities, and a regression's labels and outputs are numbers",
                ),
            ),
        ),
        Binary(
            "binary",
            "one 0/1 label per example",
            "sigmoid",
            True,
            "tf_keras.metrics.BinaryAccuracy, runner.builtins.metrics.rank_auc, tf_keras.metrics.Precision or Recall",
            (
                (
                    r"categorical_(accuracy|crossentropy)$",
                    "it compares class indices or one-hot rows over several outputs, and a binary model outputs one "
                    "probability",
                ),
            ),
        ),
        Multilabel(
            "multilabel",
            "a vector of 0/1 labels per example",
            "sigmoid",
            False,
            "tf_keras.metrics.BinaryAccuracy, F1Score (average: macro, threshold: 0.5), "
            "runner.builtins.metrics.rank_auc (multi_label: true), Precision or Recall",
            (
                (
                    r"^sparse_.*categorical",
                    "it takes one class index per example, and a multilabel example has a vector of 0/1 labels",
                ),
            ),
        ),
    )
}


def kind_named(name: str) -> TaskKind:
    """The kind a dataset callable is told (`task`, the run's task.kind, which the runner supplies), or one
    paragraph naming the kinds."""
    kind = KINDS.get(name)
    if kind is None:
        raise RunnerError(
            f"task={name!r} is not valid: the task kinds are {', '.join(KINDS)}. Fix: pass one of them (the runner "
            "passes the run's task.kind to a dataset callable that takes `task`)."
        )
    return kind

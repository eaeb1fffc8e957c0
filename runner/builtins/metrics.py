"""The built-in metrics that Keras has no exact form of. `rank_auc` is the area under the ROC curve as the model ranks
its examples: the binary and multilabel tasks' `auc` (conf/task/).

Keras' `AUC` counts examples at 200 thresholds spread evenly over [0, 1], so a model whose probabilities all lie
inside one 0.005-wide bin (a young model, or one whose outputs cluster near its labels' base rate) reads as chance
however well it ranks. `rank_auc` counts the positive and the negative examples in 2**17 equal bins of the
probability (a bin is 7.6e-6 wide) and computes the Mann-Whitney statistic from the counts: the share of
(positive, negative) pairs that the model orders correctly, a tie (the two in one bin) counted as half. That is the
exact rank AUC (scikit-learn's roc_auc_score) of the same predictions except for pairs closer than one bin, within
0.005 of it unless half the examples lie within a few bins of one another. Its state is counts, summed over replicas
and workers like any Keras metric's; an update adds each example to its bin, and the area is computed when read.

    metrics:
      auc:
        _target_: runner.builtins.metrics.rank_auc      # multi_label: true for one area per label, averaged

A user's own `tf_keras.metrics.AUC` stays Keras': interpolated over its thresholds (docs/your-own-experiment.md).
"""

from __future__ import annotations

import functools
from typing import Any

from runner.builtins.keras_lane import api, selected

# The equal bins of [0, 1] the probabilities are counted in: two float32 counts of each, 1 MiB, per label.
BINS = 2**17


def rank_auc(multi_label: bool = False, num_labels: int | None = None, bins: int = BINS, name: str = "auc") -> Any:
    """A metric of the model's Keras (runner.builtins.keras_lane) whose result is the area under the ROC curve of
    the probabilities it is updated with (labels 0/1, probabilities in [0, 1], any shape): over every label at once,
    or, with `multi_label`, each label's (the last axis) averaged; 0.5 where there is nothing to rank (examples of
    one class only). Its state is made on first use, or from num_labels."""
    return _metric_class(selected())(multi_label=multi_label, num_labels=num_labels, bins=bins, name=name)


@functools.cache
def _metric_class(version: int) -> type:
    """RankAUC for Keras `version` (a subclass of that Keras' Metric: the runner checks a metric's Keras)."""
    import tensorflow as tf  # noqa: PLC0415  the config's checks import this module in a process without TensorFlow

    class RankAUC(api(version).metrics.Metric):  # type: ignore[misc]  # the lane's Metric class, chosen at run time
        """The Mann-Whitney area under the ROC curve, from counts of the probabilities in equal bins."""

        def __init__(self, multi_label: bool, num_labels: int | None, bins: int, name: str):
            super().__init__(name=name)
            self.multi_label, self.bins = multi_label, int(bins)
            self._built = False
            if not multi_label:
                self._build(tf.TensorShape([None, 1]))
            elif num_labels is not None:
                self._build(tf.TensorShape([None, num_labels]))

        def _build(self, shape: Any) -> None:
            """The counts, one row per label (one row over all labels without multi_label): made in
            strategy.scope(), from the outputs' shape, before any update (runner.compat.keras_metrics)."""
            self.labels = int(tf.TensorShape(shape)[-1]) if self.multi_label else 1
            counts = (self.labels, self.bins)
            self.positives = self.add_weight(name="positives", shape=counts, initializer="zeros", dtype="float32")
            self.negatives = self.add_weight(name="negatives", shape=counts, initializer="zeros", dtype="float32")
            self._built = True

        def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
            if not self._built:  # outside a strategy's replica (a user's own loop): made from this first update
                self._build(y_pred.shape)
            probabilities = tf.reshape(tf.cast(y_pred, tf.float32), (-1, self.labels))
            labels = tf.reshape(tf.cast(y_true, tf.float32), (-1, self.labels))
            weights = tf.ones_like(labels)
            if sample_weight is not None:  # one weight per example, or per label
                weights = tf.reshape(tf.cast(sample_weight, tf.float32), (tf.shape(labels)[0], -1)) * weights
            bin_of = tf.cast(tf.clip_by_value(probabilities * self.bins, 0.0, self.bins - 1.0), tf.int32)
            cell = bin_of + tf.range(self.labels, dtype=tf.int32)[tf.newaxis, :] * self.bins
            size = self.labels * self.bins
            cells = tf.reshape(cell, (-1,))

            def counted(amounts: Any) -> Any:  # each example's amount added to its label's row, in its bin
                summed = tf.math.unsorted_segment_sum(tf.reshape(amounts, (-1,)), cells, size)
                return tf.reshape(summed, (self.labels, self.bins))

            self.positives.assign_add(counted(labels * weights))
            self.negatives.assign_add(counted((1.0 - labels) * weights))

        def result(self) -> Any:
            positives = tf.cast(tf.convert_to_tensor(self.positives), tf.float64)
            negatives = tf.cast(tf.convert_to_tensor(self.negatives), tf.float64)
            below = tf.cumsum(negatives, axis=1, exclusive=True)  # the negatives in lower bins than each bin
            ordered = tf.reduce_sum(positives * (below + 0.5 * negatives), axis=1)
            pairs = tf.reduce_sum(positives, axis=1) * tf.reduce_sum(negatives, axis=1)
            areas = tf.where(pairs > 0, ordered / tf.maximum(pairs, 1e-300), 0.5)
            return tf.cast(tf.reduce_mean(areas), tf.float32)

        def reset_state(self) -> None:
            if self._built:
                for counts in (self.positives, self.negatives):
                    counts.assign(tf.zeros_like(counts))

        def get_config(self) -> dict[str, Any]:
            labels = self.labels if self._built and self.multi_label else None
            return {"name": self.name, "multi_label": self.multi_label, "num_labels": labels, "bins": self.bins}

    return RankAUC

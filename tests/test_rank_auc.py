"""The binary and multilabel tasks' AUC (runner.builtins.metrics.rank_auc) against scikit-learn's exact rank AUC of
the same predictions: bunched probabilities (where Keras' 200 thresholds read chance), spread ones, labels of
several columns, weights, and the counts summed over two mirrored replicas."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from sklearn.metrics import roc_auc_score

from runner.builtins.metrics import rank_auc

REPO = Path(__file__).resolve().parents[1]
WITHIN = 0.005  # what the issue asks of the default AUC, however bunched the probabilities


def _ranked(count: int, spread: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """0/1 labels and probabilities that rank them well but not perfectly, all within `spread` of 0.4995."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(count, 2))
    labels = (features.sum(axis=1) > 0).astype(np.float32)
    score = np.tanh(features.sum(axis=1) + rng.normal(size=count))
    return labels, (0.4995 + spread * score).astype(np.float32)


def _area(metric, labels, probabilities, weights=None) -> float:
    metric.update_state(labels, probabilities, sample_weight=weights)
    return float(metric.result())


@pytest.mark.parametrize("spread", [0.0019, 0.3])
def test_the_area_is_scikit_learns_however_bunched_the_probabilities(spread):
    labels, probabilities = _ranked(2000, spread)
    exact = roc_auc_score(labels, probabilities)
    assert 0.85 < exact < 0.95
    area = _area(rank_auc(), labels.reshape(-1, 1), probabilities.reshape(-1, 1))
    assert area == pytest.approx(exact, abs=WITHIN)
    if spread < 0.005:  # every probability in one of Keras' 200 bins: its AUC reads chance
        assert _area(tf.keras.metrics.AUC(), labels.reshape(-1, 1), probabilities.reshape(-1, 1)) == 0.5


def test_several_labels_average_each_labels_area_and_weights_count_as_scikit_learn_counts_them():
    rng = np.random.default_rng(1)
    labels = (rng.random((1500, 3)) < [0.2, 0.5, 0.7]).astype(np.float32)
    probabilities = np.clip(0.3 * labels + 0.7 * rng.random((1500, 3)), 0, 1).astype(np.float32)
    macro = roc_auc_score(labels, probabilities, average="macro")
    assert _area(rank_auc(multi_label=True), labels, probabilities) == pytest.approx(macro, abs=1e-4)
    pooled = roc_auc_score(labels.ravel(), probabilities.ravel())
    assert _area(rank_auc(), labels, probabilities) == pytest.approx(pooled, abs=1e-4)
    weights = rng.random(1500).astype(np.float32)
    weighted = roc_auc_score(labels[:, 0], probabilities[:, 0], sample_weight=weights)
    assert _area(rank_auc(), labels[:, :1], probabilities[:, :1], weights) == pytest.approx(weighted, abs=1e-4)


def test_updates_accumulate_a_reset_forgets_them_and_one_class_alone_reads_one_half():
    labels, probabilities = _ranked(1000, 0.3)
    metric = rank_auc()
    metric.update_state(labels[:500, None], probabilities[:500, None])
    metric.update_state(labels[500:, None], probabilities[500:, None])
    assert float(metric.result()) == pytest.approx(roc_auc_score(labels, probabilities), abs=1e-4)
    metric.reset_state()
    assert _area(metric, np.ones((4, 1), np.float32), np.array([[0.1], [0.9], [0.2], [0.3]], np.float32)) == 0.5
    config = rank_auc(multi_label=True, num_labels=3).get_config()
    assert (config["multi_label"], config["num_labels"], config["name"]) == (True, 3, "auc")


# Run in a fresh process: splitting the CPU into two replicas can happen once per process, before any tensor.
TWO_REPLICAS = """
import numpy as np
import tensorflow as tf
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
from sklearn.metrics import roc_auc_score
from runner.builtins.metrics import rank_auc
from runner.compat.keras_metrics import build_for_outputs

rng = np.random.default_rng(2)
labels = (rng.random((512, 2)) < 0.4).astype(np.float32)
probabilities = np.clip(0.5 + 0.002 * (labels - 0.5) + 0.004 * rng.normal(size=(512, 2)), 0, 1).astype(np.float32)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    pooled, each = rank_auc(), rank_auc(multi_label=True)
    build_for_outputs(each, (2,))
batches = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((labels, probabilities)).batch(64))

@tf.function
def step(batch):
    def update(y, p):
        pooled.update_state(y, p)
        each.update_state(y, p)
    strategy.run(update, args=batch)

for batch in batches:
    step(batch)
assert abs(float(pooled.result()) - roc_auc_score(labels.ravel(), probabilities.ravel())) < 1e-4
assert abs(float(each.result()) - roc_auc_score(labels, probabilities, average="macro")) < 1e-4
print("two replicas:", float(pooled.result()), float(each.result()))
"""


@pytest.mark.slow  # a fresh TensorFlow process: about 10 s
def test_two_mirrored_replicas_sum_their_counts_into_the_area_of_every_example():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", TWO_REPLICAS], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0 and "two replicas:" in done.stdout, done.stderr[-3000:]

"""What a trained model costs (runner.training.cost): the parameters, the served model's speed by the documented
method (warmed up, the median of the timed calls) and the seconds the epochs trained, each on a model or clock whose
answer is known. A real run's costs, and the exported model's size, are checked in tests/test_model_logging.py."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tensorflow as tf

from helpers.presets import TINY, WITH_MODEL
from runner.training.controller import EpochResult
from runner.training.cost import WARM_UP_CALLS, parameter_counts, serving_speed, training_seconds

BATCH = 8


class _Sleeper(tf.keras.Model):
    """A served model whose calls take a known time: the first WARM_UP_CALLS ones slow (as a first call traces), each
    later one the next of `seconds`."""

    def __init__(self, seconds: list[float]):
        super().__init__()
        self.seconds = [0.3] * WARM_UP_CALLS + seconds
        self.calls = 0

    def _sleep(self, raw):
        time.sleep(self.seconds[self.calls])
        self.calls += 1
        return raw

    def call(self, raw, training=False):
        return tf.py_function(self._sleep, [raw], raw.dtype)


def test_the_served_speed_is_the_median_of_the_timed_calls_after_the_warm_up():
    model = _Sleeper([0.05, 0.02, 0.04, 0.03, 0.20])  # the median call: 0.04 s for a batch of 8
    speed = serving_speed(model, np.zeros((BATCH, 3), np.float32), repeats=5)
    assert model.calls == WARM_UP_CALLS + 5  # warmed up, then each repeat timed once
    assert speed.batch == BATCH
    assert 0.04 <= speed.seconds < 0.05  # neither the slow warm-up calls nor the slowest timed one
    assert speed.latency_ms == pytest.approx(speed.seconds / BATCH * 1000)
    assert speed.examples_per_second == pytest.approx(BATCH / speed.seconds)


def test_parameters_count_every_weight_and_trainable_ones_apart():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3), tf.keras.layers.BatchNormalization()])
    counts = parameter_counts(model)
    # Dense: 4 x 3 + 3; BatchNormalization: gamma and beta trainable, the moving mean and variance not.
    assert counts == {"parameters": 15 + 12, "trainable_parameters": 15 + 6}
    assert counts["parameters"] == model.count_params()


def _epoch(epoch: int, seconds: float) -> EpochResult:
    return EpochResult(epoch, {}, 100 / seconds, 0.001, 10, 100, seconds)


def test_training_seconds_add_each_epoch_by_its_clock_and_earlier_invocations_epochs_by_their_speed():
    # Epochs 1 and 2 trained before a resume (1,000 examples each at 500 and 250 per second), 3 and 4 now.
    throughput = [(1, 500.0), (2, 250.0), (3, 50.0), (4, 50.0)]
    assert training_seconds([_epoch(3, 2.5), _epoch(4, 1.5)], throughput, 1000) == pytest.approx(2 + 4 + 2.5 + 1.5)
    assert training_seconds([_epoch(1, 0.7)], [(1, 1e4)], 1000) == pytest.approx(0.7)  # one invocation: its clock


@pytest.mark.slow  # two runs of TINY in this process, each logging its model
@pytest.mark.parametrize("objective,answered_with_size", [("test_accuracy", False), ("model_bytes", True)])
def test_a_runs_answer_waits_for_its_model_only_when_the_objective_is_the_models_size(
    tmp_path, tracking_uri, objective, answered_with_size
):
    """A warm sweep worker answers its job when the run's numbers are known (runner.training.trainer.Trainer.run's
    on_result), before the model's export; the exported model's size is known only after it."""
    from omegaconf import OmegaConf

    from helpers.config import compose
    from helpers.tracking import mlflow_client
    from runner.config.settings import validate
    from runner.tracking.opening import opened_tracker
    from runner.train import run

    args = [*TINY, WITH_MODEL, f"mlflow.tracking_uri={tracking_uri}", f"sweep.objective={objective}"]
    settings = validate(OmegaConf.to_container(compose(args), resolve=True))
    answers = []
    with opened_tracker(settings.mlflow, tracks=True, in_process=True) as tracker:
        result = run(settings, str(tmp_path / "run"), tracker, args, on_result=answers.append)
    [answer] = answers
    logged = mlflow_client(tracking_uri).get_run(result.run_id).data.metrics
    assert {"parameters", "latency_ms", "training_seconds"} <= set(answer.final_metrics)
    assert ("model_bytes" in answer.final_metrics) is answered_with_size
    if answered_with_size:
        assert answer.final_metrics["model_bytes"] == logged["model_bytes"] > 0

"""The tf.distribute strategies Keras 3 does not support upstream, each with its reason: read by the config's
rule for runtime.keras=3 and by the trainer for a user's Keras 3 model, so that both refusals say the same."""

from __future__ import annotations

# Keras 3 (TensorFlow backend) trains inside strategy.run under the default strategy, OneDevice and Mirrored
# (Keras's own keras/src/backend/tensorflow/distribute_test.py); not under these.
KERAS3_UNSUPPORTED = {
    "multi_worker_mirrored": "Keras 3 does not support MultiWorkerMirroredStrategy custom loops (keras #20585)",
    "parameter_server": "Keras 3 loses updates under ParameterServerStrategy (keras #18624)",
    "central_storage": "Keras 3 miscounts metrics under CentralStorageStrategy, an experimental strategy that "
    "Keras 3 does not test",
    "tpu": "Keras 3 supports TPUStrategy custom loops only in part (keras #19448)",
}

# The fix's second half: the strategies that train Keras 3 models.
KERAS3_STRATEGIES = "pick a strategy that trains Keras 3 models (default, one_device or mirrored)"


def unsupported(strategy: str, target: str) -> str | None:
    """The paragraph for a Keras 3 model (built by `target`) under `strategy`; None where Keras 3 trains."""
    why = KERAS3_UNSUPPORTED.get(strategy)
    if why is None:
        return None
    return (
        f"model._target_={target!r} built a Keras 3 model, and strategy={strategy} cannot train it: {why}. Fix: "
        "build the model with tf_keras (`import tf_keras as keras`, or `from tensorflow import keras`, which the "
        f"runner makes tf_keras), or {KERAS3_STRATEGIES}."
    )

"""runtime.deterministic: the same command, the same numbers, bit for bit.

Every random source already comes from `seed` (the weights through tf.keras.utils.set_random_seed, the
shuffle through stateless index_shuffle keyed by seed and epoch, synthetic data through NumPy's seeded
generator). Determinism adds TensorFlow's op determinism: ops pick deterministic kernels or raise
UnimplementedError, tf.data keeps element order whatever its threads do, and a random op without a
seed raises instead of drawing from the clock. Settings refuse what cannot be reproduced (asynchronous
parameter servers) before TensorFlow is imported.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from runner.config.schema import RuntimeSettings

log = logging.getLogger("runner")


def make_deterministic(settings: RuntimeSettings, seed: int) -> None:
    """Turn on op determinism for the rest of this process (it cannot be turned off for one run only)."""
    tf.keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
    if tf.config.list_physical_devices("GPU") and (settings.jit_compile or settings.mixed_precision):
        # Measured bit-identical on CPU only; on a GPU an op without a deterministic kernel raises, but
        # XLA's fused kernels and float16 loss scaling were never compared run against run here.
        log.warning(
            "runtime.deterministic on a GPU with runtime.jit_compile or runtime.mixed_precision: "
            "TensorFlow raises for an op that has no deterministic GPU kernel, but bit-identical reruns "
            "of XLA-compiled or float16 training on GPUs have not been verified; compare two runs "
            "before relying on it"
        )

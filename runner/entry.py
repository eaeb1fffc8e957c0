"""What a process that trains sets before TensorFlow loads; every entry point calls it first.

Importing `runner` or any of its modules changes nothing in the importing process (a notebook importing
runner.config.settings, Hydra importing hydra_plugins/ in an unrelated app). The programs that train call
prepare_for_tensorflow() instead: `python -m runner` and the `runner` script (and so every sweep job, cluster
task and SLURM task, which are such commands), a job a launcher runs in another process (the task function
calls it too), and the test suite, which trains in its own process.
"""

from __future__ import annotations

import os

from runner.heap import keep_freed_memory

# Read by TensorFlow when it is imported: tf.keras is then tf_keras (Keras 2), which every strategy trains. Keras 3
# loses updates under ParameterServerStrategy and miscounts metrics under CentralStorageStrategy; the tutorial's
# custom loop runs as written on tf_keras. A model built with `import keras` is still Keras 3, trained under the
# strategies that support it (runner.builtins.keras_lane, runner.compat.keras3).
LEGACY_KERAS = ("TF_USE_LEGACY_KERAS", "1")
# TensorFlow's C++ INFO and WARNING lines stay off the terminal unless the user set a level (runner.verbosity).
CPP_LOG_LEVEL = ("TF_CPP_MIN_LOG_LEVEL", "2")


def prepare_for_tensorflow() -> None:
    """Select tf_keras, quiet TensorFlow's C++ log by default, and pad glibc's heap (runner.heap). Call before
    TensorFlow is imported; calling it again changes nothing."""
    os.environ[LEGACY_KERAS[0]] = LEGACY_KERAS[1]
    os.environ.setdefault(*CPP_LOG_LEVEL)
    keep_freed_memory()  # before TensorFlow starts its threads: see runner/heap.py

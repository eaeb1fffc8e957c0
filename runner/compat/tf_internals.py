"""TensorFlow's count of how often each tf.function retraces (`_frequent_tracing_detector_manager` in
tensorflow/python/eager/polymorphic_function/polymorphic_function.py, not a documented API); tests/test_compat.py
fails, naming TensorFlow's version, when it changes.

TensorFlow counts a method's traces by its code object, which outlives the objects it was bound to: a warm sweep
worker (runner.warm_worker) that builds a fresh model and fresh steps for every run would be told from its second
run on that its steps "triggered tf.function retracing", which they did not within that run.
"""

from __future__ import annotations

from tensorflow.python.eager.polymorphic_function import polymorphic_function


def forget_tracing_counts() -> None:
    """Start TensorFlow's retracing counts afresh (a new run in a warm worker)."""
    manager = polymorphic_function._frequent_tracing_detector_manager
    with manager._lock:
        manager._detectors.clear()

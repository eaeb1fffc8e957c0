"""Which Keras a run's model is written in, 2 (tf_keras, what `tf.keras` is in the runner) or 3 (`import keras`),
and that Keras for the built-in components: the task selects it from the model the callable built (the built-in
models from runtime.keras), and the built-in optimizers, schedules and loss read it.

One model per process, so the selection is the process's, as Keras's own global dtype policy is."""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Any

KERAS_VERSIONS = (2, 3)
_selected = 2


def select(version: int) -> None:
    """Make `version` the Keras of the built-in components in this process."""
    global _selected
    if version not in KERAS_VERSIONS:
        raise ValueError(f"Keras {version!r} is not one of {KERAS_VERSIONS}")
    _selected = version


def selected() -> int:
    return _selected


def api(version: int | None = None) -> Any:
    """The Keras module of `version` (default: the selected one): tf.keras (tf_keras) or keras (Keras 3)."""
    if (version or _selected) == 3:
        import keras  # noqa: PLC0415  Keras 3: only for a Keras 3 model, a tf_keras run never loads it

        return keras
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

    return tf.keras


def version_of(thing: object) -> int | None:
    """2 for an object of a tf_keras class, 3 for one of Keras 3, None for anything else (read from the classes'
    modules, so that asking imports neither Keras)."""
    for kind in type(thing).__mro__:
        package = kind.__module__.split(".", 1)[0]
        if package == "tf_keras":
            return 2
        if package == "keras":
            return 3
    return None


def described(model: object) -> str:
    """The Keras package and version a model is built with, e.g. `keras 3.15.1` or `tf_keras 2.21.0` (the run's
    `keras` tag: which lane trained it)."""
    package = "keras" if version_of(model) == 3 else "tf_keras"
    return f"{package} {importlib.metadata.version(package)}"


def prepare(policy: str, seed: int, keras: int) -> None:
    """Before a model is built: select Keras `keras` (runtime.keras, the built-in models' Keras), and set the
    global dtype policy and the random seed in tf_keras, and in Keras 3 when it is selected or this process has
    imported it (a Keras 3 model's module imports it before the model is built; a tf_keras run never pays for
    loading it)."""
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

    select(keras)
    tf.keras.mixed_precision.set_global_policy(policy)
    if keras == 3 or "keras" in sys.modules:
        import keras as keras3  # noqa: PLC0415  Keras 3: only where selected or already loaded

        keras3.mixed_precision.set_global_policy(policy)
        keras3.utils.set_random_seed(seed)
    tf.keras.utils.set_random_seed(seed)

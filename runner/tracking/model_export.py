"""A run's trained model as an MLflow Model: the LoggedModel named `model` whose source run is the run.

The model is a TensorFlow SavedModel of a `tf.Module` (MLflow's TensorFlow flavor, model_type `tf2-module`),
not a saved tf_keras model: `tf.saved_model.load` reads it without Keras, so it loads and serves with or
without TF_USE_LEGACY_KERAS, in a process that imported Keras 3, and in TensorFlow Serving (signature
`serving_default`). The module keeps the trained network as its attribute `network`, so a warm start restores
it by object path from the SavedModel's variables/ checkpoint (runner.training.warm_start).

The one module of runner.tracking that imports TensorFlow. It runs in the training process after the last
epoch, so neither TensorFlow's export nor the import of MLflow's TensorFlow flavor delays the start of
training or its steps.
"""

from __future__ import annotations

import logging
import time
import urllib.request
from dataclasses import dataclass
from importlib.metadata import version

import mlflow
import mlflow.tensorflow
import numpy as np
import tensorflow as tf
from mlflow.models import ModelSignature
from mlflow.types.schema import Schema, TensorSpec

from runner.tracking.artifacts import MODEL_NAME
from runner.tracking.mlflow_tracker import run_model

log = logging.getLogger("runner")

# The metric that says how long logging the model took (seconds, at the run's last step).
LOG_SECONDS = "model_log_seconds"
# The trained network's attribute in the logged module: its variables are under `network/` in the SavedModel's
# variables/ checkpoint.
NETWORK = "network"
# The SavedModel's signature for TensorFlow Serving, and its output's name.
SERVING_SIGNATURE = "serving_default"
SERVING_OUTPUT = "probabilities"


def served_module(network: tf.keras.Model, classifier: tf.keras.Model) -> tf.Module:
    """A tf.Module around `classifier` (raw inputs in, probabilities out) that a SavedModel can hold without
    Keras: calling it, or its `serve` signature, runs the classifier; `network` (the trained model inside the
    classifier, its variables shared) is tracked under its own name for warm starts."""
    images = tf.TensorSpec((None, *classifier.input_shape[1:]), classifier.inputs[0].dtype, name="images")

    class ServedModel(tf.Module):
        def __init__(self):
            super().__init__(name="served_model")
            setattr(self, NETWORK, network)
            self.classifier = classifier

        @tf.function(input_signature=[images])
        def __call__(self, raw):  # what mlflow.pyfunc's predict calls
            return self.classifier(raw, training=False)

        @tf.function(input_signature=[images])
        def serve(self, raw):  # TensorFlow Serving's signature: named outputs
            return {SERVING_OUTPUT: self.classifier(raw, training=False)}

    return ServedModel()


@dataclass(frozen=True)
class ExportedModel:
    model_id: str
    run_id: str
    seconds: float
    logged: bool  # False: the run already had its model (a resumed run that had logged it before), or no server
    bytes: int = 0  # the size of the logged model's files (its MLmodel, environment files and SavedModel)


def log_run_model(
    network: tf.keras.Model,
    classifier: tf.keras.Model,
    tracking_uri: str,
    run_id: str,
    step: int,
    example_images: np.ndarray,
    name: str = MODEL_NAME,
) -> ExportedModel:
    """Log `classifier` (raw inputs in, probabilities out: runner.training.task.Experiment.export_model
    of the trained `network`) as the run's model, linked to the run's metrics at `step` (the epoch of its weights),
    unless the run has a model of that `name` already (`checkpoint-<epoch>` for a checkpoint's); `example_images`
    are a few raw inputs, as the data holds them. A tracking server that does not answer gets no model now (MLflow
    would retry for minutes, then fail the run): the run's next invocation logs it."""
    started = time.perf_counter()
    if not answers(tracking_uri):
        log.warning(
            "the MLflow tracking server %s does not answer, so the model of run %s is not logged now. Fix: "
            "once it answers, re-run the same command with the same hydra.run.dir: the run has trained "
            "every epoch, so that logs its model (and delivers whatever else it had not taken).",
            tracking_uri,
            run_id,
        )
        return ExportedModel("", run_id, 0.0, logged=False)
    client = mlflow.MlflowClient(tracking_uri)
    existing = run_model(client, run_id, name)
    if existing is not None:
        log.info("MLflow run %s already has its model %s (%s): not logged again", run_id, existing.model_id, name)
        return ExportedModel(existing.model_id, run_id, 0.0, logged=False)
    signature = ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(example_images.dtype), (-1, *classifier.input_shape[1:]))]),
        outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, *classifier.output_shape[1:]))]),
    )
    # Model.log takes the tracking store and the LoggedModel's experiment from MLflow's globals even when
    # given a run id (without an active experiment the model would land in experiment 0).
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(experiment_id=client.get_run(run_id).info.experiment_id)
    module = served_module(network, classifier)
    info = mlflow.tensorflow.log_model(
        module,
        name=name,
        run_id=run_id,
        step=step,
        signature=signature,
        input_example=example_images,
        saved_model_kwargs={"signatures": {SERVING_SIGNATURE: module.serve}},
        # Given, so that MLflow does not start a process to infer them. The SavedModel needs no tf-keras.
        pip_requirements=[f"tensorflow=={version('tensorflow')}"],
    )
    seconds = time.perf_counter() - started
    size = model_bytes(client, info.model_id)
    log.info(
        "logged the model %s of MLflow run %s (runs:/%s/%s, %d bytes) in %.1f s",
        info.model_id,
        run_id,
        run_id,
        name,
        size,
        seconds,
    )
    return ExportedModel(info.model_id, run_id, seconds, logged=True, bytes=size)


def model_bytes(client: mlflow.MlflowClient, model_id: str, path: str | None = None) -> int:
    """The size of the LoggedModel's files under `path` (None: all of them), as its artifact store lists them."""
    return sum(
        model_bytes(client, model_id, item.path) if item.is_dir else int(item.file_size or 0)
        for item in client.list_logged_model_artifacts(model_id, path)
    )


def discard_run_model(tracking_uri: str, run_id: str) -> None:
    """Delete the run's model, for a run that ends FAILED or KILLED: such a run has none (resumed, it logs
    its model again when it finishes)."""
    client = mlflow.MlflowClient(tracking_uri)
    model = run_model(client, run_id)
    if model is not None:
        client.delete_logged_model(model.model_id)
        log.info("deleted the model %s of MLflow run %s, which did not finish", model.model_id, run_id)


def answers(tracking_uri: str, timeout: float = 5.0) -> bool:
    """False for a tracking server whose /health does not answer (any other store: True)."""
    if not tracking_uri.startswith(("http://", "https://")):
        return True
    try:
        with urllib.request.urlopen(tracking_uri.rstrip("/") + "/health", timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False

"""Warm start (init.from): a fresh run's model takes its weights, before step 1, from a checkpoint, a run's
logged model or a registered model version. Only the model's variables: the optimizer and the epoch counter
start afresh, so fine-tuning is a new run with a new learning-rate schedule."""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import tensorflow as tf
import yaml
from tensorflow.core.protobuf.trackable_object_graph_pb2 import TrackableObjectGraph

from runner.config.schema import InitSettings
from runner.errors import RunnerError
from runner.tracking.run_id_file import RUN_ID_FILE
from runner.training.checkpoints import listed_checkpoints, unreadable

log = logging.getLogger("runner")

# Run tags: where the weights came from (the param init.from says what was asked for).
FROM_TAG = "init.from"
SOURCE_RUN_TAG = "init.source_run_id"
MODEL_VERSION_TAG = "init.model_version"
LOGGED_MODEL_TAG = "init.model_id"

_FIX_SHAPES = (
    "Fix: start from a model trained with the same model options and the same data shape and number "
    "of classes (the model callable receives input_shape and num_classes from the data), or drop "
    "init.from to train this model from its own initialisation."
)


@dataclass(frozen=True)
class Origin:
    """What the model was initialised from."""

    description: str  # for the log line: the checkpoint, or the URI and what it resolved to
    variables: int
    tags: dict[str, str] = field(default_factory=dict)


def warm_start(
    init: InitSettings, model: tf.keras.Model, tracking_uri: str | None, resumed_from: str | None
) -> Origin | None:
    """Copy init.from's weights into `model` (built in strategy.scope(); call outside it, before step 1).

    `resumed_from`: the run directory's own checkpoint that was restored, if any; a resumed run keeps it and
    init.from is ignored. Raises RunnerError, before anything is assigned, when the source cannot be found or
    read, or when a variable's shape differs (naming the first such variable in the model's order)."""
    if init.source is None:
        return None
    if resumed_from is not None:
        log.info(
            "init.from=%s is ignored: the run directory holds checkpoints, and the run resumes from its own (%s)",
            init.source,
            resumed_from,
        )
        return None
    if init.kind == "checkpoint":
        origin = _from_checkpoint(init.source, model)
    else:
        origin = _from_mlflow(init.source, init.kind, model, tracking_uri)
    log.info("initialised the model from %s (%d variables)", origin.description, origin.variables)
    return origin


def _from_checkpoint(source: str, model: tf.keras.Model) -> Origin:
    """A runner checkpoint (tf.train.Checkpoint with the model under `model`): the newest readable one of a
    directory, or the one named. Restored the way a resumed run restores, matched by the model's structure."""
    path = _readable_checkpoint(source)
    where = f"init.from={source!r}" + ("" if path == source else f" (its checkpoint {path})")
    keys = _checkpoint_keys(path, model)
    shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    for variable in model.weights:
        key = keys.get(id(variable))
        if key is not None and tuple(shapes[key]) != tuple(variable.shape):
            raise _mismatch(where, variable, tuple(shapes[key]))
    try:
        status = tf.train.Checkpoint(model=model).restore(path)
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError) as error:
        raise RunnerError(
            f"{where}: the checkpoint does not fit this model ({str(error).splitlines()[0][:300]}). " + _FIX_SHAPES
        ) from None
    status.expect_partial()  # the optimizer and epoch counter in it are left unused on purpose
    tags = {FROM_TAG: path}
    run_id_file = os.path.join(os.path.dirname(os.path.dirname(path)), RUN_ID_FILE)
    if os.path.isfile(run_id_file):  # a runner run directory: the MLflow run that wrote the checkpoint
        with open(run_id_file) as handle:
            tags[SOURCE_RUN_TAG] = handle.read().strip()
    return Origin(path, len(model.weights), tags)


def _readable_checkpoint(source: str) -> str:
    """`source` itself (a checkpoint prefix), or its directory's newest checkpoint that reads in full."""
    if not os.path.isdir(source):
        reason = unreadable(source)
        if reason:
            raise RunnerError(
                f"init.from={source!r} cannot be read ({reason}). Fix: point init.from at another "
                "checkpoint, or at its directory to take the newest readable one."
            )
        return source
    listed = listed_checkpoints(source)  # never repaired here: the directory belongs to another run
    for path in reversed(listed):
        reason = unreadable(path)
        if not reason:
            return path
        log.warning("checkpoint %s is unreadable (%s): trying the one before", path, reason)
    raise RunnerError(
        f"init.from={source!r} holds no readable checkpoint ({len(listed)} listed, none reads in full). "
        "Fix: point init.from at another run directory, or at runs:/<run id>/model of that run."
    )


def _checkpoint_keys(path: str, model: tf.keras.Model, root: str = "model") -> dict[int, str]:
    """id(variable) -> its key in the checkpoint, for the model's variables the checkpoint holds under `root`: the
    model's trackable children walked alongside the checkpoint's object graph (the matching a restore does)."""
    graph = TrackableObjectGraph()
    graph.ParseFromString(tf.train.load_checkpoint(path).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    keys: dict[int, str] = {}
    queue, visited = deque([(tf.train.Checkpoint(**{root: model}), 0)]), set()
    while queue:
        trackable, node_id = queue.popleft()
        if (id(trackable), node_id) in visited:
            continue
        visited.add((id(trackable), node_id))
        node = graph.nodes[node_id]
        # A variable is what the checkpoint holds a value of: a tf.Variable, or a Keras 3 variable (which wraps one
        # and is not a tf.Variable itself).
        key = next((a.checkpoint_key for a in node.attributes if a.name == "VARIABLE_VALUE"), None)
        if key is not None or isinstance(trackable, tf.Variable):
            if key is not None:
                keys.setdefault(id(trackable), key)
            continue
        children = {child.local_name: child.node_id for child in node.children}
        for name, child in tf.train.TrackableView(trackable).children(trackable).items():
            if name in children:
                queue.append((child, children[name]))
    return keys


def _from_mlflow(source: str, kind: str | None, model: tf.keras.Model, tracking_uri: str | None) -> Origin:
    """runs:/<run id>/<name>, models:/<name>@<alias> | models:/<name>/<version>, or a LoggedModel id (`kind`
    logged_model): the logged model. The runner's
    SavedModel (runner.tracking.model_export) holds the trained network under `network`: restored by object path
    from its variables/ checkpoint. A tf_keras model logged before (the raw-input wrapper of
    Experiment.export_model): its inner trained network's variables are copied in order."""
    import mlflow.artifacts  # noqa: PLC0415  MLflow: only for a runs:/ or models:/ source
    import mlflow.tensorflow  # noqa: PLC0415  MLflow: as above

    from runner.tracking.store import open_client  # noqa: PLC0415  MLflow: as above

    client = open_client(tracking_uri)
    location, description, tags = _logged_model(client, source) if kind == "logged_model" else _resolve(client, source)
    with _without_download_bar(), tempfile.TemporaryDirectory(prefix="runner-init-") as scratch:
        try:
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=location, dst_path=scratch, tracking_uri=client.tracking_uri
            )
            saved_model = _saved_model_dir(local)
            # A model logged before the runner logged SavedModels: a tf_keras model, loaded (outside the run's
            # strategy: a plain copy to read) and copied from in order.
            loaded = None if saved_model else mlflow.tensorflow.load_model(local)
        except RunnerError:
            raise
        except Exception as error:  # noqa: BLE001 (a download or a load that fails means one thing here)
            raise RunnerError(
                f"init.from={source!r} resolved to {location}, but its model could not be loaded "
                f"({type(error).__name__}: {' '.join(str(error).split())[:300]}). Fix: check that it is a "
                "model logged by the runner (MLflow's TensorFlow flavor) and that its artifacts are reachable "
                "from here."
            ) from None
        where = f"init.from={source!r}"
        if saved_model:
            _restore_network(where, os.path.join(saved_model, "variables", "variables"), model)
            return Origin(description, len(model.weights), {FROM_TAG: source, **tags})
    _copy_in_order(where, _trained_network(source, loaded), model)
    return Origin(description, len(model.weights), {FROM_TAG: source, **tags})


@contextmanager
def _without_download_bar() -> Iterator[None]:
    """No download bar in the run's log: MLflow's progress bar for artifacts off while the block runs."""
    from mlflow.environment_variables import (  # noqa: PLC0415  MLflow: only for a runs:/ or models:/ source
        MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR,
    )

    name = MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name
    was = os.environ.get(name)
    os.environ[name] = "false"
    try:
        yield
    finally:
        if was is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = was


def _copy_in_order(where: str, trained: tf.keras.Model, model: tf.keras.Model) -> None:
    """`trained`'s variables into `model`'s, in order, once every shape is known to match."""
    sources, targets = trained.weights, model.weights
    for index, variable in enumerate(targets):
        if index >= len(sources):
            raise RunnerError(
                f"{where}: the source model has {len(sources)} variables, and this model's variable "
                f"{variable.name} (number {index + 1} of {len(targets)}) has none to come from. " + _FIX_SHAPES
            )
        if tuple(sources[index].shape) != tuple(variable.shape):
            raise _mismatch(where, variable, tuple(sources[index].shape))
    if len(sources) > len(targets):
        raise RunnerError(
            f"{where}: the source model has {len(sources)} variables and this model only "
            f"{len(targets)}, so it is another architecture. " + _FIX_SHAPES
        )
    # Assigned from the cross-replica context: a distributed variable updates every replica's copy.
    for variable, value in zip(targets, [weight.numpy() for weight in sources], strict=True):
        variable.assign(tf.cast(value, variable.dtype))


def _variables_under(path: str, child: str) -> int:
    """How many variables the checkpoint's object graph holds below the root's child `child`."""
    graph = TrackableObjectGraph()
    graph.ParseFromString(tf.train.load_checkpoint(path).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    start = [node.node_id for node in graph.nodes[0].children if node.local_name == child]
    keys: set[str] = set()
    queue, visited = deque(start), set()
    while queue:
        node_id = queue.popleft()
        if node_id in visited:
            continue
        visited.add(node_id)
        node = graph.nodes[node_id]
        keys.update(a.checkpoint_key for a in node.attributes if a.name == "VARIABLE_VALUE")
        queue.extend(reference.node_id for reference in node.children)
    return len(keys)


def _saved_model_dir(local: str) -> str | None:
    """The SavedModel directory of a downloaded MLflow Model in the TensorFlow flavor's `tf2-module` form (what
    the runner logs), or None for a tf_keras model (what it logged before)."""
    with open(os.path.join(local, "MLmodel")) as handle:
        flavor = (yaml.safe_load(handle).get("flavors") or {}).get("tensorflow") or {}
    if flavor.get("model_type") != "tf2-module":
        return None
    return os.path.join(local, flavor["saved_model_dir"])


def _restore_network(where: str, path: str, model: tf.keras.Model) -> None:
    """The variables of `model` from the checkpoint `path` of a logged SavedModel, matched by object path under
    its `network` (the trained network): every variable must be found there with its shape, and the source
    network must have no more variables than this model."""
    from runner.tracking.model_export import NETWORK  # noqa: PLC0415  MLflow: only for a logged model

    keys = _checkpoint_keys(path, model, root=NETWORK)
    shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    for index, variable in enumerate(model.weights):
        key = keys.get(id(variable))
        if key is None:
            raise RunnerError(
                f"{where}: the logged model has no value for this model's variable {variable.name} "
                f"(number {index + 1} of {len(model.weights)}). " + _FIX_SHAPES
            )
        if tuple(shapes[key]) != tuple(variable.shape):
            raise _mismatch(where, variable, tuple(shapes[key]))
    network = _variables_under(path, NETWORK)
    if network == 0:
        raise RunnerError(
            f"{where}: the logged model holds no trained network under `{NETWORK}`, so it was not "
            "logged by the runner. Fix: start from a model logged by the runner, or from a run "
            "directory's checkpoint."
        )
    if network > len(model.weights):
        raise RunnerError(
            f"{where}: the source model has {network} variables and this model only "
            f"{len(model.weights)}, so it is another architecture. " + _FIX_SHAPES
        )
    # Assigned from the cross-replica context: a distributed variable updates every replica's copy.
    tf.train.Checkpoint(**{NETWORK: model}).restore(path).expect_partial()


def _logged_model(client, model_id: str) -> tuple[str, str, dict[str, str]]:
    """The artifact location of the LoggedModel `model_id` (a run's model, or a checkpoint's with
    mlflow.log_every_checkpoint), its description and tags."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415  MLflow: only for an MLflow source

    try:
        logged = client.get_logged_model(model_id)
    except MlflowException as error:
        message = " ".join(str(error.message).split())[:300]
        raise RunnerError(
            f"init.from={model_id!r} names a LoggedModel that the MLflow store {client.tracking_uri} does not have "
            f"({message}). Fix: copy the id from mlflow.search_logged_models or the run's Models tab in `mlflow ui`, "
            "and check that mlflow.tracking_uri (or MLFLOW_TRACKING_URI) points at the store that holds it."
        ) from None
    tags = {LOGGED_MODEL_TAG: model_id}
    if logged.source_run_id:
        tags[SOURCE_RUN_TAG] = logged.source_run_id
    of_run = f" of MLflow run {logged.source_run_id}" if logged.source_run_id else ""
    return logged.artifact_location, f"LoggedModel {model_id} ({logged.name}{of_run})", tags


def _resolve(client, source: str) -> tuple[str, str, dict[str, str]]:
    """The artifact location of the model a runs:/ or models:/ URI names, its description and tags."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415  MLflow: only for a runs:/ or models:/ source

    store = client.tracking_uri
    try:
        if source.startswith("runs:"):
            parts = re.fullmatch(r"runs:/([^/]+)/(.+)", source)
            assert parts is not None  # runner.config.settings.init_settings checked its shape
            run_id, name = parts.groups()
            run = client.get_run(run_id)
            found = client.search_logged_models(
                [run.info.experiment_id], filter_string=f"name = '{name}' AND source_run_id = '{run_id}'", max_results=1
            )
            if not found:
                raise RunnerError(
                    f"init.from={source!r}: MLflow run {run_id} in {store} has no model named {name!r} (a run logs "
                    "its model when it finishes, unless mlflow.log_model=false). Fix: use a run that finished "
                    "with its model, or its run directory (init.from=<run dir>) to start from its checkpoint."
                )
            return found[0].artifact_location, source, {SOURCE_RUN_TAG: run_id}
        parts = re.fullmatch(r"models:/([^/@]+)(?:@(.+)|/(\d+))", source)
        assert parts is not None  # runner.config.settings.init_settings checked its shape
        name, alias, number = parts.groups()
        version = (
            client.get_model_version_by_alias(name, alias)
            if alias is not None
            else client.get_model_version(name, number)
        )
        location = version.source
        if location.startswith("models:/"):
            # Registered from models:/<model id> (mlflow.register_model does): download_artifacts would look that
            # up in MLflow's default store, so find the LoggedModel's artifacts in this client's store.
            model_id = version.model_id or location.removeprefix("models:/").split("/")[0]
            location = client.get_logged_model(model_id).artifact_location
    except MlflowException as error:
        message = " ".join(str(error.message).split())[:300]
        looked_up = "MLflow run" if source.startswith("runs:") else "registered model version"
        raise RunnerError(
            f"init.from={source!r} names a {looked_up} that the MLflow store {store} does not have ({message}). "
            "Fix: check the name, alias, version or run id in `mlflow ui` (the Models page lists registered "
            "models with their versions and aliases), and that mlflow.tracking_uri (or MLFLOW_TRACKING_URI) "
            "points at the store that holds it."
        ) from None
    tags = {MODEL_VERSION_TAG: f"{name}/{version.version}"}
    if version.run_id:
        tags[SOURCE_RUN_TAG] = version.run_id
    description = f"{source} (version {version.version}" + (
        f", MLflow run {version.run_id})" if version.run_id else ")"
    )
    return location, description, tags


def _trained_network(source: str, loaded) -> tf.keras.Model:
    """The trained network inside the logged wrapper (its one layer that is a model), or the model itself."""
    if not isinstance(loaded, tf.keras.Model):
        raise RunnerError(
            f"init.from={source!r} loads as {type(loaded).__module__}.{type(loaded).__qualname__}, not a tf_keras "
            "model. Fix: start from a model logged by the runner, or from its run directory's checkpoint."
        )
    inner = [layer for layer in loaded.layers if isinstance(layer, tf.keras.Model)]
    return inner[0] if len(inner) == 1 else loaded


def _mismatch(where: str, variable: tf.Variable, source_shape: tuple) -> RunnerError:
    return RunnerError(
        f"{where}: variable {variable.name} has shape {source_shape} in the source and "
        f"{tuple(variable.shape)} here. " + _FIX_SHAPES
    )

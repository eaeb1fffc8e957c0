"""A composed config validated into the one typed `Settings` the program reads: `validate(config)`.

Each key is checked by its declaration in runner.config.schema; the rules here are the ones across keys. This
module imports no TensorFlow, so a mistyped value is refused in a fraction of a second, before any MLflow run
exists. Every refusal is a RunnerError naming the value and the fix, with the key as `RunnerError.key`.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import urllib.parse
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any, TypeVar

from runner.compat.keras3 import KERAS3_STRATEGIES, KERAS3_UNSUPPORTED
from runner.config.checks import Number, Text, refusal
from runner.config.components import Component, check_targets
from runner.config.schema import (
    MULTI_PROCESS_STRATEGIES,
    MULTI_REPLICA_CPU_STRATEGIES,
    TARGET_GROUPS,
    TRACKING_SCHEMES,
    InitSettings,
    MlflowSettings,
    Settings,
    StrategySettings,
    SweepSettings,
    config_name,
    declared,
    group_class,
)
from runner.errors import RunnerError

Kind = TypeVar("Kind")
__all__ = ["Settings", "MlflowSettings", "SweepSettings", "InitSettings", "validate", "checked_targets"]


def validate(config: Mapping[str, Any]) -> Settings:
    """Validate a composed config (a resolved DictConfig or plain mapping) into Settings."""
    settings = dataclasses.replace(_group(Settings, config, ""), composed=config)
    _strategy_rules(settings.strategy)
    _cluster_rules(settings)
    _keras_rules(settings)
    _argument_rules(settings)
    _mlflow_rules(settings.mlflow)
    return _with_data_dir(_init(settings))


def mlflow_settings(config: Mapping[str, Any]) -> MlflowSettings:
    """The mlflow group validated alone (what a sweep checks before its parent run, where a swept key may still
    change the rest of the config)."""
    settings = _group(MlflowSettings, _section(config, "mlflow"), "mlflow.")
    _mlflow_rules(settings)
    return settings


def sweep_settings(config: Mapping[str, Any]) -> SweepSettings:
    """The sweep group validated alone: the objective and the seeds."""
    return _group(SweepSettings, _section(config, "sweep"), "sweep.")


def target_components(config: Mapping[str, Any], groups: tuple[str, ...] = TARGET_GROUPS) -> list[Component]:
    """The `_target_` callables of a composed config with the arguments it gives them, without validating the rest."""
    found = [_component(name, _section(config, name), _own_keys(name), _optional(name)) for name in groups]
    return [component for component in found if component is not None]


def checked_targets(settings: Settings) -> Settings:
    """Settings whose `_target_` callables import and take the arguments their config gives (one paragraph
    otherwise). A null argument the callable does not take is left out: an option's `dir: null` does not stick
    to a `_target_` given on the command line."""
    found = check_targets(
        [settings.model, settings.optimizer.component, settings.schedule, settings.loss, settings.dataset.component]
    )
    model, optimizer, schedule, loss, dataset = found
    return dataclasses.replace(
        settings,
        model=model,
        schedule=schedule,
        loss=loss,
        optimizer=dataclasses.replace(settings.optimizer, component=optimizer),
        dataset=dataclasses.replace(settings.dataset, component=dataset),
    )


def _group(kind: type[Kind], node: Mapping[str, Any], prefix: str) -> Kind:
    """The settings class `kind` from its node, each key checked by its declaration."""
    values: dict[str, Any] = {}
    for item in declared(kind):
        name = config_name(kind, item)
        if "group" in item.metadata:
            values[item.name] = _group(group_class(kind, item), _section(node, name, prefix), f"{prefix}{name}.")
        elif "target" in item.metadata:
            own, optional = item.metadata["declared"], bool(item.metadata.get("optional"))
            section = node if prefix else _section(node, name)
            values[item.name] = _component(prefix.rstrip(".") or name, section, own, optional)
        else:
            key = item.metadata["shown_as"] or prefix + name
            values[item.name] = item.metadata["check"](key, node.get(name), item.metadata["fix"])
    return kind(**values)


def _optional(name: str) -> bool:
    """Whether a top-level `_target_` group may be null (pruner)."""
    return any(item.name == name and item.metadata.get("optional") for item in declared(Settings))


def _own_keys(name: str) -> tuple[str, ...]:
    """The keys of a `_target_` group that are the runner's, not the callable's (dataset.name, optimizer.lr)."""
    item = next(item for item in declared(Settings) if item.name == name)
    if "target" in item.metadata:
        return item.metadata["declared"]
    inner = group_class(Settings, item)
    return next(each.metadata["declared"] for each in declared(inner) if "target" in each.metadata)


def _section(config: Mapping[str, Any], key: str, parent: str = "") -> Mapping[str, Any]:
    """A group of settings (strategy, checkpoint, ...): an override that replaced it by a value is refused."""
    node = config.get(key)
    if not isinstance(node, Mapping):
        name = parent + key
        raise refusal(
            name,
            node,
            "it is a group of settings, not a value",
            f"set the group's keys one at a time (e.g. {name}.<key>=<value>)"
            + ("" if parent else f", or pick one of its options with {key}=<option> where conf/{key}/ has options"),
        )
    return node


def _component(
    group: str, node: Mapping[str, Any], own_keys: tuple[str, ...], optional: bool = False
) -> Component | None:
    """A `_target_` node: the callable's dotted path and the arguments the config gives it (None: an optional
    group's null `_target_`)."""
    target = node.get("_target_")
    if target is None and optional:
        return None
    if not isinstance(target, str) or not target.strip() or "." not in target:
        raise refusal(
            f"{group}._target_",
            target,
            "it must be the dotted path of a callable (module.function)",
            f"pick one of the {group} group's options ({group}=<option>) or give your own, e.g. "
            f"{group}._target_=mylab.{group}s.build",
        )
    return Component(group, target, {key: value for key, value in node.items() if key not in own_keys})


# --- rules across keys ---------------------------------------------------------------------------------------


def _strategy_rules(strategy: StrategySettings) -> None:
    name, replicas = strategy.name, strategy.cpu_replicas
    if replicas is not None and name not in MULTI_REPLICA_CPU_STRATEGIES:
        raise refusal(
            "strategy.cpu_replicas",
            replicas,
            f"strategy={name} cannot use several CPU replicas on one machine",
            "use strategy=mirrored or strategy=central_storage with it, or drop strategy.cpu_replicas",
        )
    if replicas is not None and strategy.devices is not None:
        raise refusal(
            "strategy.cpu_replicas",
            replicas,
            "it conflicts with the explicit strategy.devices list",
            "give either strategy.devices or strategy.cpu_replicas, not both",
        )
    if strategy.communication != "auto" and name != "multi_worker_mirrored":
        raise refusal(
            "strategy.communication",
            strategy.communication,
            f"strategy={name} does not all-reduce across processes",
            "use it with strategy=multi_worker_mirrored, or drop strategy.communication",
        )
    shards = strategy.variable_partitioner.max_shards
    if shards is not None and name != "parameter_server":
        raise refusal(
            "strategy.variable_partitioner.max_shards",
            shards,
            f"strategy={name} keeps whole variables (only parameter servers hold shards)",
            "use it with strategy=parameter_server, or set it to null",
        )


def _cluster_rules(settings: Settings) -> None:
    kind, strategy = settings.cluster.kind, settings.strategy.name
    if kind == "none" and strategy in MULTI_PROCESS_STRATEGIES:
        raise refusal(
            "cluster",
            kind,
            f"strategy={strategy} trains in several processes that form a TensorFlow cluster",
            "add cluster=local to start one on this machine (cluster.workers=2, and cluster.ps=1 for "
            "parameter_server), or cluster=tf_config / cluster=slurm where TF_CONFIG or srun describe the cluster",
        )
    if kind != "none" and strategy not in MULTI_PROCESS_STRATEGIES:
        raise refusal(
            "cluster",
            kind,
            f"strategy={strategy} trains in a single process",
            "use strategy=multi_worker_mirrored or strategy=parameter_server with a cluster, or drop the "
            "cluster override",
        )
    if strategy == "parameter_server" and settings.loop.steps_per_epoch is None:
        raise refusal(
            "loop.steps_per_epoch",
            None,
            "strategy=parameter_server has no natural end of an epoch (each worker draws batches from its "
            "own endless dataset)",
            "pass a fixed number of steps per epoch, e.g. loop.steps_per_epoch=50",
        )
    if settings.runtime.deterministic and strategy == "parameter_server":
        raise refusal(
            "runtime.deterministic",
            True,
            "strategy=parameter_server trains asynchronously: each worker applies its updates whenever it finishes "
            "a step, so the order of updates (and every number after the first step) depends on timing, and each "
            "worker shuffles with a seed of its own",
            "use strategy=multi_worker_mirrored (synchronous) for a reproducible multi-process run, or drop "
            "runtime.deterministic to train with parameter servers",
        )


def _keras_rules(settings: Settings) -> None:
    """runtime.keras=3 only with the strategies Keras 3 supports upstream (runner.compat.keras3)."""
    strategy = settings.strategy.name
    if settings.runtime.keras == 3 and strategy in KERAS3_UNSUPPORTED:
        raise refusal(
            "runtime.keras",
            3,
            f"strategy={strategy} cannot train a Keras 3 model: {KERAS3_UNSUPPORTED[strategy]}",
            f"use runtime.keras=2 (tf_keras) with strategy={strategy}, or {KERAS3_STRATEGIES}",
        )


_DATA_DIR_FIX = (
    "point dataset.dir at the directory holding the data (fashion_mnist: the four IDX files{}, or null to use "
    "tf.keras.datasets; image_folder: its train/ and test/ folders)"
)


def _argument_rules(settings: Settings) -> None:
    """The built-in arguments the runner knows the meaning of: dataset.dir, model.weight_decay."""
    directory = settings.dataset.component.arguments.get("dir")
    if directory is not None:
        if not isinstance(directory, str) or not directory:
            raise refusal("dataset.dir", directory, "it must be a directory's path or null", _DATA_DIR_FIX.format(""))
        if not os.path.isdir(os.path.expanduser(directory)):
            raise refusal(
                "dataset.dir",
                os.path.expanduser(directory),
                "no such directory",
                _DATA_DIR_FIX.format(" train-images-idx3-ubyte.gz, ..."),
            )
    if "weight_decay" in settings.model.arguments:
        Number()("model.weight_decay", settings.model.arguments["weight_decay"], _WEIGHT_DECAY_FIX)


_WEIGHT_DECAY_FIX = "pass a non-negative L2 factor, e.g. model.weight_decay=1e-5"


def _with_data_dir(settings: Settings) -> Settings:
    directory = settings.dataset.component.arguments.get("dir")
    if not isinstance(directory, str):
        return settings
    component = settings.dataset.component
    expanded = Component(
        component.group, component.target, {**component.arguments, "dir": os.path.expanduser(directory)}
    )
    return dataclasses.replace(settings, dataset=dataclasses.replace(settings.dataset, component=expanded))


def _mlflow_rules(mlflow: MlflowSettings) -> None:
    uri = mlflow.tracking_uri
    if uri is not None:  # first: the messages below would repeat the URI
        refuse_credentials_in_uri("mlflow.tracking_uri", uri)
        schemes = (*TRACKING_SCHEMES, *(entry.name for entry in entry_points(group="mlflow.tracking_store")))
        if uri.split(":")[0].split("+")[0] not in schemes:
            raise refusal(
                "mlflow.tracking_uri",
                uri,
                "MLflow 3 tracks into a database or a tracking server, named by a URI such as "
                f"sqlite:///path.db (schemes: {', '.join(schemes)}), and refuses a directory",
                "pass a store such as sqlite:///mlflow.db or http://host:5000, or leave it null for MLflow's default",
            )
    if any(char in mlflow.registered_model_name for char in "/:"):  # they separate the parts of a models:/ URI
        raise refusal(
            "mlflow.registered_model_name",
            mlflow.registered_model_name,
            "it must not contain '/' or ':'",
            "name the registered model without them, e.g. mlflow.registered_model_name=fashion_mnist",
        )
    if mlflow.register and not mlflow.log_model:
        raise RunnerError(
            "mlflow.register=true needs the run's model, but mlflow.log_model=false skips logging it. "
            "Fix: drop mlflow.log_model=false, or drop mlflow.register=true.",
            key="mlflow.register",
        )


def refuse_credentials_in_uri(key: str, uri: str) -> None:
    """A tracking URI with a password in it (user:password@) would put the password in params, logs and error
    messages: refused, with where the password goes instead."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return
    redacted = parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()
    where = (
        "the environment variables MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (docs/team-server.md)"
        if parts.scheme in ("http", "https")
        else "the database client's own password file or variable (PostgreSQL: ~/.pgpass or PGPASSWORD)"
    )
    raise RunnerError(
        f"{key}={redacted!r} is not valid: it embeds a password (user:password@), which would be recorded with "
        f"the run's params and logs. Fix: give the address without it and the credentials in {where}.",
        key=key,
    )


_INIT_FIX = (
    "pass a run directory of an earlier run (or its checkpoints/ directory), runs:/<run id>/model, "
    "models:/<name>@<alias> (e.g. models:/fashion_mnist@champion) or models:/<name>/<version>; "
    "or init.from=null to start from the model's own initialisation"
)


def _init_source(source: str) -> InitSettings:
    """init.from is runs:/<run id>/<path>, models:/<name>@<alias>, models:/<name>/<version>, or a run directory,
    its checkpoints/ directory or one checkpoint (a ckpt-N prefix) that exists."""
    if source.startswith("runs:"):
        if not re.fullmatch(r"runs:/[^/\s]+/\S+", source):
            raise refusal("init.from", source, "a run's model is named runs:/<run id>/<artifact path>", _INIT_FIX)
        return InitSettings(source, "runs")
    if source.startswith("models:"):
        if not re.fullmatch(r"models:/[^/@:\s]+(@[^/@\s]+|/\d+)", source):
            why = "a registered model's version is named models:/<name>@<alias> or models:/<name>/<version number>"
            raise refusal("init.from", source, why, _INIT_FIX)
        return InitSettings(source, "models")
    if re.match(r"[A-Za-z][\w+.-]*:/", source):
        why = "the runner loads weights from runs:/ and models:/ URIs and from local checkpoint directories"
        raise refusal("init.from", source, why, _INIT_FIX)
    path = os.path.abspath(os.path.expanduser(source))
    if os.path.isfile(path + ".index"):  # one checkpoint, named by its prefix (.../checkpoints/ckpt-96)
        return InitSettings(path, "checkpoint")
    if not os.path.isdir(path):
        why = f"there is no directory {path} (nor a checkpoint of that name), and it is not a runs:/ or models:/ URI"
        raise refusal("init.from", source, why, _INIT_FIX)
    for directory in (path, os.path.join(path, "checkpoints")):
        if os.path.isfile(os.path.join(directory, "checkpoint")) or glob.glob(os.path.join(directory, "ckpt-*.index")):
            return InitSettings(directory, "checkpoint")
    why = f"{path} holds no checkpoint (no ckpt-*.index files in it or in its checkpoints/ directory)"
    raise refusal("init.from", source, why, _INIT_FIX)


def _init(settings: Settings) -> Settings:
    return dataclasses.replace(settings, init=init_settings(_section(settings.composed, "init")))


def init_settings(node: Mapping[str, Any]) -> InitSettings:
    """The init group: init.from's kind, found by looking at the value; the group takes no other key."""
    for key in node:
        if key != "from":
            raise refusal(
                f"init.{key}",
                node[key],
                "the init group has one key, init.from",
                "give where the weights come from as init.from=<run dir, runs:/ or models:/ URI>",
            )
    source = Text(nullable=True)("init.from", node.get("from"), _INIT_FIX)
    return InitSettings(None, None) if source is None else _init_source(source)

"""The project's real configuration: conf/ composed by Hydra exactly as `python -m runner` composes it."""

from __future__ import annotations

import copy
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"


def compose(overrides: list[str]):
    """The composed config exactly as `python -m runner <overrides>` would see it."""
    from runner.config.check import compose_config
    from runner.sweeps.launch.launchers import rename_launcher_schemas

    rename_launcher_schemas()  # as runner/__main__.py does before composing
    return compose_config(overrides)


def mlflow_settings(tracking_uri: str, *overrides: str):
    """The MLflow settings of `python -m runner mlflow.tracking_uri=<uri> mlflow.experiment_name=tests
    <overrides>` (each `mlflow.<key>=<value>`): the schema's defaults for the rest."""
    from omegaconf import OmegaConf

    from runner.config.settings import mlflow_settings as settings

    config = compose([f"mlflow.tracking_uri={tracking_uri}", "mlflow.experiment_name=tests", *overrides])
    return settings(OmegaConf.to_container(config, resolve=True))


def dataset_settings(kind: str = "synthetic", **keys):
    """The dataset settings of `python -m runner dataset=<kind> dataset.<key>=<value> ...` (None: null)."""
    from omegaconf import OmegaConf

    from runner.config.settings import validate

    overrides = [
        f"dataset={kind}",
        *(f"dataset.{key}={'null' if value is None else value}" for key, value in keys.items()),
    ]
    return validate(OmegaConf.to_container(compose(overrides), resolve=True)).dataset


def overridden(config: dict, override: str) -> dict:
    """`config` with one key=value (or ~key) override applied as Hydra parses it, without composing anew."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    [parsed] = OverridesParser.create().parse_overrides([override])
    config = copy.deepcopy(config)
    *parents, key = parsed.key_or_group.split(".")
    node = config
    for parent in parents:
        node = node[parent]
    if parsed.is_delete():
        del node[key]
    else:
        node[key] = parsed.value()
    return config

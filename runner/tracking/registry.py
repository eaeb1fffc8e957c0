"""The Model Registry: a run's model as a new version of a registered model, and the alias `champion` on
the version with the best objective.

Each version carries the objective it was chosen by as tags (name, value, direction), so versions
registered by different sweeps, processes or machines compare without reading their runs. Several
registrations may run at once (parallel sweeps): the store numbers versions atomically, and the alias
is settled by re-reading every version after each write until a read finds it on the best one, so the
last registrant to write always corrects a stale write of another. Works on any MLflow store
(sqlite, a tracking server on PostgreSQL). Never imports TensorFlow.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass

from mlflow.entities import LoggedModel
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.tracking import MlflowClient

from runner.errors import RunnerError
from runner.tracking.artifacts import MODEL_NAME
from runner.tracking.mlflow_tracker import run_model

log = logging.getLogger("runner")

CHAMPION = "champion"
# Version tags: what the version was chosen by, and where it came from.
OBJECTIVE_TAG = "objective"
VALUE_TAG = "objective_value"
DIRECTION_TAG = "objective_direction"  # minimize | maximize
SWEEP_TAG = "sweep_parent_run_id"
# Enough for any number of registrants: each pass either finds the alias settled or moves it to a
# strictly better version, and versions are finite.
_SETTLE_PASSES = 50
_CREATE_ATTEMPTS = 5


@dataclass(frozen=True)
class Registration:
    name: str
    version: int
    champion: ModelVersion | None  # the champion once settled
    created: bool  # False: the run's model was registered already (a re-run)
    score: tuple[str, str, float] | None = None  # this version's (objective, direction, value), as _score reads it

    def describe(self) -> str:
        if self.champion is None:
            champion = "no champion"
        elif int(self.champion.version) == self.version:
            champion = f"now @{CHAMPION}"
        else:
            champion = f"@{CHAMPION} stays on version {self.champion.version} {self._why_it_stays()}"
        return (
            f"{'registered' if self.created else 'already registered:'} models:/{self.name}/{self.version}, {champion}"
        )

    def _why_it_stays(self) -> str:
        """Why this version did not take the alias: what settle_champion compared (_best)."""
        assert self.champion is not None
        held = _score(self.champion)
        if held is None:  # put there by hand, on a version without the runner's tags
            return "(a version without the runner's objective tags)"
        objective, direction, value = held
        if self.score is None or self.score[:2] != held[:2]:
            chosen_by = f"{self.score[0]} ({self.score[1]})" if self.score else "no objective"
            return (
                f"({objective} {value:.6g}): versions compare only on the champion's objective, {objective} "
                f"({direction}), and this version was chosen by {chosen_by}"
            )
        better = "lower" if direction == "minimize" else "higher"
        return (
            f"because its {objective} {value:.6g} is better than or equal to this version's {self.score[2]:.6g} "
            f"({better} is better; the alias moves only to a strictly better version)"
        )


def register_run_model(
    client: MlflowClient,
    name: str,
    run_id: str,
    objective: str,
    value: float,
    lower_is_better: bool,
    tags: dict[str, str] | None = None,
) -> Registration:
    """Register the run's model as a new version of `name` (once per run), then settle `champion`."""
    model = run_model(client, run_id)
    if model is None:
        raise RunnerError(
            f"MLflow run {run_id} has no model to register (no LoggedModel named {MODEL_NAME!r} from it): a run "
            "logs its model only when it finishes. Fix: re-run it to completion with the same hydra.run.dir, "
            "then register again."
        )
    if not math.isfinite(value):
        raise RunnerError(
            f"MLflow run {run_id} has {objective}={value}, which cannot be compared with other versions. "
            "Fix: register a run that finished with a finite objective, or pick another sweep.objective."
        )
    _create_registered_model(client, name)
    existing = [version for version in _versions(client, name) if version.run_id == run_id]
    if existing:
        version, created = existing[0], False
    else:
        version_tags = {
            OBJECTIVE_TAG: objective,
            VALUE_TAG: repr(float(value)),
            DIRECTION_TAG: "minimize" if lower_is_better else "maximize",
            **(tags or {}),
        }
        version, created = _create_version(client, name, model, version_tags), True
    champion = settle_champion(client, name)
    registration = Registration(name, int(version.version), champion, created, _score(version))
    log.info("%s", registration.describe())
    return registration


def settle_champion(client: MlflowClient, name: str) -> ModelVersion | None:
    """Put `champion` on the best version and return it; leave it where it is when no version beats it.

    Versions compare on the champion's objective (with no champion yet: the newest version's); a version
    registered for another objective never displaces it. Re-reads after every write, until a read finds
    the alias where it belongs: a registrant that wrote from a stale read is corrected by its own next pass,
    and every registrant's last word is a read that agreed."""
    for _ in range(_SETTLE_PASSES):
        versions = _versions(client, name)
        champion = champion_version(client, name)
        best = _best(versions, champion)
        if best is None or (champion is not None and best.version == champion.version):
            return champion
        try:
            client.set_registered_model_alias(name, CHAMPION, best.version)
        except MlflowException:
            # Two registrants setting the alias for its first time at once: on PostgreSQL the second insert
            # fails on the alias's unique key. The next pass reads what the first wrote and settles from there.
            continue
    raise RunnerError(
        f"the alias {CHAMPION!r} of registered model {name!r} kept moving while {_SETTLE_PASSES} reads settled it: "
        "something else is rewriting it. Fix: stop the other writer, then run this registration again."
    )


def champion_version(client: MlflowClient, name: str) -> ModelVersion | None:
    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:  # no alias yet (or its version was deleted)
        return None


def _score(version: ModelVersion) -> tuple[str, str, float] | None:
    """(objective, direction, value) of a version registered by the runner; None for any other version."""
    tags = version.tags
    try:
        return tags[OBJECTIVE_TAG], tags[DIRECTION_TAG], float(tags[VALUE_TAG])
    except (KeyError, ValueError):
        return None


def _best(versions: list[ModelVersion], champion: ModelVersion | None) -> ModelVersion | None:
    """The version `champion` belongs on: the champion itself unless a version of its objective is strictly
    better (among equally good versions, the oldest)."""
    if champion is not None and all(version.version != champion.version for version in versions):
        versions = [*versions, champion]  # created after `versions` was read
    scored = [(version, score) for version in versions if (score := _score(version)) is not None]
    reference = _score(champion) if champion is not None else None
    if reference is None:  # no champion (or one set by hand): the newest version's objective decides
        if not scored:
            return None
        reference = max(scored, key=lambda item: int(item[0].version))[1]
    objective, direction, _ = reference
    sign = -1.0 if direction == "minimize" else 1.0
    group = [(sign * score[2], version) for version, score in scored if score[:2] == (objective, direction)]
    top = max(value for value, _ in group)
    if champion is not None and _score(champion) == reference and sign * reference[2] >= top:
        return champion
    return min((version for value, version in group if value == top), key=lambda version: int(version.version))


def _versions(client: MlflowClient, name: str) -> list[ModelVersion]:
    versions: list[ModelVersion] = []
    token = None
    while True:
        page = client.search_model_versions(f"name = '{name}'", max_results=1000, page_token=token)
        versions.extend(page)
        token = page.token
        if not token:
            return versions


def _create_registered_model(client: MlflowClient, name: str) -> None:
    try:
        client.create_registered_model(name)
    except MlflowException as error:
        if error.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
            raise


def _create_version(client: MlflowClient, name: str, model: LoggedModel, tags: dict[str, str]) -> ModelVersion:
    """A new version numbered by the store in one transaction. Concurrent registrants can collide on the
    number (the store retries a few times) or, on sqlite, on the database lock: try again after a pause.

    The source is the model's artifact location: given `models:/<model id>`, a sqlite store would look the
    model up in MLflow's default store rather than this client's."""
    for attempt in range(_CREATE_ATTEMPTS):
        try:
            return client.create_model_version(
                name, model.artifact_location, run_id=model.source_run_id, tags=tags, model_id=model.model_id
            )
        except MlflowException as error:
            retriable = "Model Version creation error" in str(error) or "database is locked" in str(error)
            if not retriable or attempt == _CREATE_ATTEMPTS - 1:
                raise
            time.sleep(random.uniform(0.2, 1.0))
    raise AssertionError("unreachable")

"""The kinds of value a key of the schema takes, each a check that returns the value or raises the key's paragraph.

A check also says how OmegaConf holds the value while Hydra composes (`holds`): an int or a string where
OmegaConf's conversion is what the runner wants (a quoted `batch='64'` becomes 64), `Any` where the runner is
stricter than OmegaConf (it would turn `progress=1` into true, and `lr=0` into 0.0 in the paragraph). Whether a
key may be null is its field's type (`int | None`): the validator passes it as `nullable`.
"""

from __future__ import annotations

import difflib
import math
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from runner.errors import RunnerError


def refusal(key: str, value: Any, why: str, fix: str) -> RunnerError:
    """The one paragraph for a bad value, carrying its key as data."""
    return RunnerError(f"{key}={value!r} is not valid: {why}. Fix: {fix}", key=key)


def _integer(value: Any) -> bool:
    """An integer as the user means it: bool is an int in Python, and "64" from a YAML string is not one either."""
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return _integer(value) or isinstance(value, float)


@dataclass(frozen=True)
class Check:
    """One kind of value: what it `accepts` (returned as `convert` makes it), and the paragraph's `why` otherwise."""

    why: str
    accepts: Callable[[Any], bool]
    convert: Callable[[Any], Any] = lambda value: value
    holds: Any = Any
    or_null: str = " or null"  # what `why` adds where the key may be null
    nulls: tuple[Any, ...] = (None,)  # the values that mean null where the key may be null

    def __call__(self, key: str, value: Any, fix: str, nullable: bool = False) -> Any:
        if nullable and value in self.nulls:
            return None
        if not self.accepts(value):
            raise refusal(key, value, self.why + (self.or_null if nullable else ""), fix)
        return self.convert(value)


class Int(Check):
    """An integer from `minimum` (to `maximum`); OmegaConf holds it as an int, so `batch='64'` is 64."""

    def __init__(self, minimum: int = 1, maximum: int | None = None) -> None:
        need = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        if maximum is not None:
            need = f"an integer from {minimum} to {maximum}"
        top = math.inf if maximum is None else maximum
        super().__init__(f"it must be {need}", lambda value: _integer(value) and minimum <= value <= top, holds=int)


class Number(Check):
    """A finite number >= minimum (> minimum if `positive`): NaN and infinity compare as no user means."""

    def __init__(self, minimum: float = 0.0, positive: bool = False) -> None:
        def accepts(value: Any) -> bool:
            return _real(value) and math.isfinite(value) and (value > minimum if positive else value >= minimum)

        super().__init__(
            f"it must be a finite number {'>' if positive else '>='} {minimum}", accepts, float, or_null=""
        )


class Choice(Check):
    """One of `options`; `why`: what the paragraph says instead of listing them. A misspelt option is named: did
    you mean the closest one."""

    options: tuple[str | int, ...]

    def __init__(self, *options: str | int, why: str = "") -> None:
        listed = "the options are " + ", ".join(map(str, options))
        holds = int if all(isinstance(option, int) for option in options) else str
        super().__init__(why or listed, lambda value: value in options, holds=holds, or_null="" if why else ", null")
        object.__setattr__(self, "options", options)  # the dataclass is frozen

    def __call__(self, key: str, value: Any, fix: str, nullable: bool = False) -> Any:
        try:
            return super().__call__(key, value, fix, nullable)
        except RunnerError:
            names = [str(option) for option in self.options]
            close = difflib.get_close_matches(str(value), names, n=1) if isinstance(value, str) else []
            if not close:
                raise
            why = self.why + (self.or_null if nullable else "")
            raise refusal(key, value, f"{why} (did you mean {key}={close[0]}?)", fix) from None


class Among(Check):
    """One of a table's names (runner.task_kinds.KINDS), read when a value is checked: a row added to the table
    after this module was imported (a kind of a user's own) is an option too. Refused as a Choice of them."""

    registry: Mapping[str, Any]

    def __init__(self, registry: Mapping[str, Any]) -> None:
        super().__init__("", lambda value: value in registry, holds=str)
        object.__setattr__(self, "registry", registry)  # the dataclass is frozen

    def __call__(self, key: str, value: Any, fix: str, nullable: bool = False) -> Any:
        return Choice(*self.registry)(key, value, fix, nullable)


BOOL = Check("it must be true or false", lambda value: isinstance(value, bool))
FRACTION = Check(
    "it must be a number between 0 and 1, both excluded", lambda value: _real(value) and 0 < value < 1, float
)
# A non-empty string (a number is taken as its digits); '' is null too where the key may be null.
TEXT = Check(
    "it must be a non-empty string",
    lambda value: _integer(value) or isinstance(value, str) and bool(value.strip()),
    str,
    holds=str,
    nulls=(None, ""),
)
# A metric's logged name (train_loss, val_accuracy): one of the run's metric table's, which the validator checks
# with the `metrics` group (runner.config.settings.check_metric_keys).
METRIC_KEY = Check(
    "it must be a metric's name, e.g. val_accuracy", lambda value: isinstance(value, str) and bool(value)
)


def _is_list(value: Any) -> bool:
    """A list as the config holds it (a Python list or tuple, or OmegaConf's ListConfig)."""
    return isinstance(value, Sequence) and not isinstance(value, str)


def _one_or_list(value: Any, accepts: Callable[[Any], bool]) -> bool:
    if _is_list(value):
        return bool(value) and all(accepts(item) for item in value)
    return accepts(value)


def _tuple_if_list(value: Any) -> Any:
    return tuple(value) if _is_list(value) else value


# A sweep's objective: one metric's name, or a list of them (a sweep over several objectives).
METRIC_KEYS = Check(
    "it must be a metric's name or a list of them, e.g. val_accuracy or [val_accuracy,parameters]",
    lambda value: _one_or_list(value, lambda item: isinstance(item, str) and bool(item)),
    _tuple_if_list,
)


def one_or_list(choice: Choice) -> Check:
    """`choice`'s values, or a non-empty list of them (one per objective of a sweep over several)."""
    return Check(
        f"{choice.why}, or a list of them",
        lambda value: _one_or_list(value, lambda item: choice.accepts(item)),
        _tuple_if_list,
    )


# sweep.constraints: each a metric, <= or >=, and a number ("parameters <= 100000").
CONSTRAINT_LINES = Check(
    "it must be a list of constraints, each a metric, <= or >= and a number, e.g. ['parameters <= 100000']",
    lambda value: _is_list(value) and all(isinstance(item, str) for item in value),
    tuple,
)
# A non-empty list of device names (null: auto-detect).
DEVICES = Check(
    "it must be a non-empty list of device names",
    lambda value: isinstance(value, (list, tuple)) and bool(value) and all(isinstance(d, str) and d for d in value),
    tuple,
)
# A TPU's name or address; null reads as '' (a TPU VM's own TPU). OmegaConf would turn 5 into '5'.
ADDRESS = Check(
    "it must be a TPU name or address", lambda value: value is None or isinstance(value, str), lambda value: value or ""
)
# A value another part of the validator checks with the rest of its group (init.from).
UNCHECKED = Check("", lambda value: True)

# The stores MLflow 3 tracks into (its file store only reads); a driver may follow a '+' (postgresql+psycopg2).
TRACKING_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc", "uc")


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


class TrackingUri(Check):
    """An MLflow tracking store's URI: no password in it (its own paragraph, the password left out), and a scheme
    MLflow 3 tracks into, its own or a plugin's (`mlflow.tracking_store` entry points)."""

    def __init__(self) -> None:
        super().__init__(TEXT.why, TEXT.accepts, str, holds=str, nulls=TEXT.nulls)

    def __call__(self, key: str, value: Any, fix: str, nullable: bool = False) -> Any:
        uri = super().__call__(key, value, fix, nullable)
        if uri is None:
            return None
        refuse_credentials_in_uri(key, uri)  # first: the paragraph below would repeat the password
        schemes = (*TRACKING_SCHEMES, *(entry.name for entry in entry_points(group="mlflow.tracking_store")))
        if uri.split(":")[0].split("+")[0] not in schemes:
            why = (
                "MLflow 3 tracks into a database or a tracking server, named by a URI such as sqlite:///path.db "
                f"(schemes: {', '.join(schemes)}), and refuses a directory"
            )
            raise refusal(key, uri, why, fix)
        return uri


TRACKING_URI = TrackingUri()
# A registered model's name: '/' and ':' separate the parts of a models:/ URI.
MODEL_NAME = Check(
    "it must be a non-empty string without '/' or ':'",
    lambda value: TEXT.accepts(value) and not any(char in str(value) for char in "/:"),
    str,
    holds=str,
)

"""The kinds of value a key of the schema takes, each a check that returns the value or raises the key's paragraph.

A check also says how OmegaConf holds the value while Hydra composes (`holds`): an int or a string where
OmegaConf's conversion is what the runner wants (a quoted `batch='64'` becomes 64), `Any` where the runner is
stricter than OmegaConf (it would turn `progress=1` into true, and `lr=0` into 0.0 in the paragraph).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from runner.errors import RunnerError


def refusal(key: str, value: Any, why: str, fix: str) -> RunnerError:
    """The one paragraph for a bad value, carrying its key as data."""
    return RunnerError(f"{key}={value!r} is not valid: {why}. Fix: {fix}", key=key)


@dataclass(frozen=True)
class Int:
    minimum: int = 1
    maximum: int | None = None
    nullable: bool = False
    holds: Any = int

    def __call__(self, key: str, value: Any, fix: str) -> int | None:
        if value is None and self.nullable:
            return None
        # bool is an int in Python, and "64" from a YAML string is not what the user meant either.
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < self.minimum
            or (self.maximum is not None and value > self.maximum)
        ):
            need = "a positive integer" if self.minimum == 1 else f"an integer >= {self.minimum}"
            if self.maximum is not None:
                need = f"an integer from {self.minimum} to {self.maximum}"
            raise refusal(key, value, f"it must be {need}" + (" or null" if self.nullable else ""), fix)
        return value


@dataclass(frozen=True)
class Number:
    """A finite number >= minimum (> minimum if `positive`): NaN and infinity compare as no user means."""

    minimum: float = 0.0
    positive: bool = False
    nullable: bool = False
    holds: Any = Any

    def __call__(self, key: str, value: Any, fix: str) -> float | None:
        if value is None and self.nullable:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or (value <= self.minimum if self.positive else value < self.minimum)
        ):
            sign = ">" if self.positive else ">="
            raise refusal(key, value, f"it must be a finite number {sign} {self.minimum}", fix)
        return float(value)


@dataclass(frozen=True)
class Fraction:
    """A number strictly between 0 and 1 (or null where `nullable`)."""

    nullable: bool = False
    holds: Any = Any

    def __call__(self, key: str, value: Any, fix: str) -> float | None:
        if value is None and self.nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            raise refusal(
                key,
                value,
                "it must be a number between 0 and 1, both excluded" + (" or null" if self.nullable else ""),
                fix,
            )
        return float(value)


@dataclass(frozen=True)
class Bool:
    nullable: bool = False
    holds: Any = Any

    def __call__(self, key: str, value: Any, fix: str) -> bool | None:
        if self.nullable and value is None:
            return None
        if not isinstance(value, bool):
            raise refusal(key, value, "it must be true or false" + (" or null" if self.nullable else ""), fix)
        return value


@dataclass(frozen=True)
class Text:
    """A non-empty string (a number is taken as its digits); '' or null is None where `nullable`."""

    nullable: bool = False
    holds: Any = str

    def __call__(self, key: str, value: Any, fix: str) -> str | None:
        if self.nullable and (value is None or value == ""):
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            raise refusal(key, value, "it must be a non-empty string" + (" or null" if self.nullable else ""), fix)
        return value


@dataclass(frozen=True)
class Choice:
    options: tuple[str | int, ...]
    nullable: bool = False
    why: str = ""  # what the paragraph says instead of listing the options
    holds: Any = str

    def __call__(self, key: str, value: Any, fix: str) -> str | None:
        if value is None and self.nullable:
            return None
        if value not in self.options:
            options = ", ".join(map(str, self.options)) + (", null" if self.nullable else "")
            raise refusal(key, value, self.why or f"the options are {options}", fix)
        return value


@dataclass(frozen=True)
class Devices:
    """A non-empty list of device names, or null to auto-detect."""

    holds: Any = Any

    def __call__(self, key: str, value: Any, fix: str) -> tuple[str, ...] | None:
        if value is None:
            return None
        if not isinstance(value, (list, tuple)) or not value or not all(isinstance(d, str) and d for d in value):
            raise refusal(key, value, "it must be a non-empty list of device names or null", fix)
        return tuple(value)


@dataclass(frozen=True)
class Address:
    """A TPU's name or address; null reads as '' (a TPU VM's own TPU). OmegaConf would turn 5 into '5'."""

    holds: Any = Any

    def __call__(self, key: str, value: Any, fix: str) -> str:
        value = "" if value is None else value
        if not isinstance(value, str):
            raise refusal(key, value, "it must be a TPU name or address", fix)
        return value


@dataclass(frozen=True)
class Unchecked:
    """A value another part of the validator checks with the rest of its group (init.from)."""

    holds: Any = Any

    def __call__(self, key: str, value: Any, fix: str) -> Any:
        return value


Check = Int | Number | Fraction | Bool | Text | Choice | Devices | Address | Unchecked

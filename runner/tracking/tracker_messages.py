"""What crosses the pipe between the training process and its tracker child (runner.tracking.tracker_process and
runner.tracking.tracker_child): the training process sends a call it waits for (Call, answered by a Reply with the
same number), an Operation it does not wait for (runner.tracking.operations), or Close; the child sends replies and
its log lines. No MLflow here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from runner.tracking.operations import Operation

Answer = TypeVar("Answer")


class Request(Generic[Answer]):
    """A call whose answer (of type Answer) the training process waits for."""


@dataclass(frozen=True)
class Start(Request[str]):
    """Create or continue the run of run_dir: its id."""

    run_dir: str
    params: dict[str, Any]
    tags: dict[str, str] | None


@dataclass(frozen=True)
class MetricHistories(Request[dict[str, list[tuple[int, float]]]]):
    """Every metric of the run, once what was handed over before has been delivered."""


@dataclass(frozen=True)
class TrackingUri(Request[str]):
    """The store the run is tracked in."""


@dataclass(frozen=True)
class Call:
    number: int
    request: Request[Any]


@dataclass(frozen=True)
class Close:
    pass


@dataclass(frozen=True)
class Reply:
    number: int
    ok: bool
    value: Any  # the answer, or (not ok) the exception to raise


@dataclass(frozen=True)
class LogLine:
    level: int
    message: str


ToChild = Call | Operation | Close
ToParent = Reply | LogLine

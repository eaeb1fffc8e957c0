"""What a run hands to MLflow without waiting for an answer, one dataclass per kind: the training process sends
them to the tracker process (runner.tracking.tracker_process), which journals each as its `op` and `args`
(runner.tracking.journal) and delivers it through MlflowTracker.deliver. No MLflow here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, NoReturn


@dataclass(frozen=True)
class LogMetrics:
    op: ClassVar[str] = "log_metrics"
    metrics: dict[str, float]
    step: int
    timestamp: int | None = None  # milliseconds: when it was measured (None: when it is delivered)


@dataclass(frozen=True)
class SystemMetrics:
    """A sample of the system-metrics monitor (it runs in the tracker process)."""

    op: ClassVar[str] = "system_metrics"
    metrics: dict[str, float]
    step: int
    timestamp: int


@dataclass(frozen=True)
class LogText:
    op: ClassVar[str] = "log_text"
    text: str
    artifact_file: str


@dataclass(frozen=True)
class LogArtifact:
    op: ClassVar[str] = "log_artifact"
    path: str
    artifact_path: str | None = None


@dataclass(frozen=True)
class SetTags:
    op: ClassVar[str] = "set_tags"
    tags: dict[str, str]


@dataclass(frozen=True)
class LogInputs:
    op: ClassVar[str] = "log_inputs"
    descriptions: list[dict[str, Any]]  # runner.data.describe


@dataclass(frozen=True)
class End:
    """The run's end: `message` is the error in words (runner.tracking.lifecycle.failure_message), or None."""

    op: ClassVar[str] = "end"
    message: str | None
    resumable: bool


Operation = LogMetrics | SystemMetrics | LogText | LogArtifact | SetTags | LogInputs | End

KINDS: dict[str, type[Operation]] = {
    kind.op: kind for kind in (LogMetrics, SystemMetrics, LogText, LogArtifact, SetTags, LogInputs, End)
}


def journal_args(operation: Operation) -> dict[str, Any]:
    """The operation's fields, as the journal keeps them next to its op."""
    return {field.name: getattr(operation, field.name) for field in fields(operation)}


def from_journal(op: str, args: Mapping[str, Any]) -> Operation:
    """The operation a journal record holds; ValueError for an op this version does not know."""
    kind = KINDS.get(op)
    if kind is None:
        raise ValueError(f"unknown journal record {op!r}")
    return kind(**args)


def unhandled(operation: NoReturn) -> NoReturn:
    """The default branch of a match over Operation: the type checker reports a kind that has no case."""
    raise ValueError(f"unknown operation {operation!r}")

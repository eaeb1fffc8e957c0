"""What the fluent `mlflow.start_run` does for a run that the runner, which creates its runs with MlflowClient, does
through MLflow's undocumented internals: the system-metrics monitor attached to any run by id, and the context tags
(user, source, git). tests/test_compat.py fails, naming MLflow's version, when any of them changes.

The monitor relies on SystemMetricsMonitor's constructor, its `monitors`, `sampling_interval`,
`samples_before_logging`, `collect_metrics`/`aggregate_metrics`, its private `_shutdown_event`, `_metrics_prefix`
and `_logging_step`, and on CPUMonitor; the tags on `mlflow.tracking.context.registry.resolve_tags(ignore=...)`,
`GitRunContext` and `mlflow.utils.git_utils`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psutil
from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
from mlflow.tracking.context.git_context import GitRunContext
from mlflow.tracking.context.registry import resolve_tags
from mlflow.utils.git_utils import get_git_branch, get_git_commit, get_git_repo_url

log = logging.getLogger("runner")

# What this module reads or sets on a SystemMetricsMonitor, and the keyword arguments it passes it.
MONITOR_ATTRIBUTES = (
    "monitors",
    "sampling_interval",
    "samples_before_logging",
    "collect_metrics",
    "aggregate_metrics",
    "_shutdown_event",
    "_metrics_prefix",
    "_logging_step",
    "node_id",
    "start",
    "finish",
)
MONITOR_ARGUMENTS = ("run_id", "sampling_interval", "samples_before_logging", "resume_logging", "tracking_uri")


class _Monitor(SystemMetricsMonitor):
    """MLflow's SystemMetricsMonitor, with two changes: each sample goes to `publish(metrics, step)` (the tracker
    decides how it reaches the run), and the sampling thread does not ask the server for the run's status before
    every sample (a server that stops answering would stop MLflow's loop for good, with a warning on the
    terminal); it stops when the tracker stops it."""

    def __init__(self, publish: Callable[[dict[str, float], int], None], **kwargs: Any):
        super().__init__(**kwargs)
        self._publish = publish

    def monitor(self) -> None:
        while True:
            for _ in range(self.samples_before_logging):
                self.collect_metrics()
                if self._shutdown_event.wait(self.sampling_interval):
                    return
            self.publish_metrics(self.aggregate_metrics())

    def publish_metrics(self, metrics: dict[str, float]) -> None:
        prefix = self._metrics_prefix + (self.node_id + "/" if self.node_id else "")
        try:
            self._publish({prefix + key: value for key, value in metrics.items()}, self._logging_step)
        except Exception as error:  # as MLflow's own loop does: the run goes on without them
            log.warning("system metrics are no longer logged: %s", error)
            self._shutdown_event.set()
        self._logging_step += 1
        for each in self.monitors:
            each.clear_metrics()


class _FirstSampleMeasuredCpu(CPUMonitor):
    """MLflow's CPU monitor, whose first sample measures a short window instead of reading 0: psutil measures
    since the calling thread's previous call, and the sampling thread is new."""

    WINDOW_SECONDS = 0.2
    _started = False

    def collect_metrics(self) -> None:
        if not self._started:
            psutil.cpu_percent()
            time.sleep(self.WINDOW_SECONDS)  # on the sampling thread: nothing waits for it
            self._started = True
        super().collect_metrics()


def system_metrics_monitor(
    publish: Callable[[dict[str, float], int], None], run_id: str, *, interval_seconds: float, tracking_uri: str
) -> SystemMetricsMonitor:
    """A monitor (not started) that samples CPU, memory, disk, network and GPUs every `interval_seconds` and hands
    each sample to `publish(metrics, step)`, its steps going on from those `run_id` holds."""
    monitor = _Monitor(
        publish,
        run_id=run_id,
        sampling_interval=interval_seconds,
        samples_before_logging=1,
        resume_logging=True,
        tracking_uri=tracking_uri,
    )
    monitor.monitors = [_FirstSampleMeasuredCpu() if type(each) is CPUMonitor else each for each in monitor.monitors]
    # The config decides, not MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL left in the environment.
    monitor.sampling_interval = interval_seconds
    return monitor


def context_tags_without_git() -> dict[str, str]:
    """MLflow's context tags as its fluent start_run resolves them (`mlflow.user`, `mlflow.source.name` and
    `.type`), without the git ones: GitRunContext would look at sys.argv[0]'s directory."""
    return resolve_tags(ignore=[GitRunContext])  # type: ignore[list-item]  # MLflow types instances; it takes classes


def git_source(path: str) -> tuple[str | None, str | None, str | None]:
    """The commit, branch and remote URL of the git checkout `path` lies in; (None, None, None) outside one."""
    commit = get_git_commit(path)
    if commit is None:
        return None, None, None
    return commit, get_git_branch(path), get_git_repo_url(path)

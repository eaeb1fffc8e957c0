"""What the fluent `mlflow.start_run` does for a run that the runner, which creates its runs with MlflowClient, does
through MLflow's undocumented internals: the system-metrics monitor attached to any run by id, and the context tags
(user, source, git); and the bulk read of metric histories that MLflow's UI makes from a tracking server, which no
client API offers. tests/test_compat.py fails, naming MLflow's version, when any of them changes.

The monitor relies on SystemMetricsMonitor's constructor, its `monitors`, `sampling_interval`,
`samples_before_logging`, `collect_metrics`/`aggregate_metrics`, its private `_shutdown_event`, `_metrics_prefix`
and `_logging_step`, and on CPUMonitor; the tags on `mlflow.tracking.context.registry.resolve_tags(ignore=...)`,
`GitRunContext` and `mlflow.utils.git_utils`; the bulk read on `mlflow.utils.rest_utils.http_request` and
`verify_rest_response` (what MlflowClient's REST store calls, with its credentials from
`mlflow.utils.credentials.get_default_host_creds`) and on the UI's route
`/ajax-api/2.0/mlflow/metrics/get-history-bulk`.
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
from mlflow.utils.credentials import get_default_host_creds
from mlflow.utils.git_utils import get_git_branch, get_git_commit, get_git_repo_url
from mlflow.utils.rest_utils import http_request, verify_rest_response

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


# The route MLflow's UI reads charts from: every point of one metric of up to 100 runs, in one query, at most
# 25,000 points a response (mlflow/server/__init__.py; MAX_RUNS_GET_METRIC_HISTORY_BULK, MAX_HISTORY_RESULTS).
UI_BULK_HISTORY_ENDPOINT = "/ajax-api/2.0/mlflow/metrics/get-history-bulk"


class ServerRequests:
    """GET requests to a tracking server's REST endpoints, with the credentials MlflowClient would send
    (MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN, the TLS variables)."""

    def __init__(self, tracking_uri: str):
        self.credentials = get_default_host_creds(tracking_uri)

    def get(self, endpoint: str, params: dict[str, Any], *, missing_ok: bool = False) -> dict[str, Any] | None:
        """The JSON answer; None where `missing_ok` and the server does not serve `endpoint` (404). Any other
        failure raises MLflow's own exception, as MlflowClient's would."""
        response = http_request(self.credentials, endpoint, "GET", params=params)
        if missing_ok and response.status_code == 404:
            return None
        verify_rest_response(response, endpoint)
        return response.json()

"""The per-epoch histories of a sweep's child runs, read in as few requests as the tracking store allows.

MlflowClient.get_metric_history asks for one run's one metric: a sweep of 500 runs and 5 drawn metrics is 2,500
requests to a tracking server. MlflowClient has no bulk read, but `mlflow server` answers two:
`GET /ajax-api/2.0/mlflow/metrics/get-history-bulk` (what MLflow's UI charts with: every point of one metric of up
to 100 runs, in one SQL query, at most 25,000 points a response) and the REST API's
`GET /api/2.0/mlflow/metrics/get-history-bulk-interval` (GetMetricHistoryBulkInterval in MLflow's service.proto: up
to 2,500 points per run, a longer history evenly sampled, but two queries per run on the server: measured 2 s for
100 runs on 2 cores, against 0.1 s). So the first is asked, a batch that comes back full is halved and asked again,
and where a server does not serve it (404) the REST one is asked instead. Either way the histories cost about
ceil(runs / 100) requests per metric, whatever the number of epochs. The requests go through MLflow's own REST helpers
and credentials, as MlflowClient's would (runner.compat.mlflow_internals, where those internals and the UI's route
are kept). A local store (sqlite:///, a database URI) is read in-process, where a request is a query, per run and
metric."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mlflow.tracking import MlflowClient

from runner.compat.mlflow_internals import UI_BULK_HISTORY_ENDPOINT as UI_BULK_ENDPOINT
from runner.compat.mlflow_internals import ServerRequests

BULK_ENDPOINT = "/api/2.0/mlflow/metrics/get-history-bulk-interval"
RUNS_PER_REQUEST = 100  # the server's limit for both (MAX_RUNS_GET_METRIC_HISTORY_BULK)
UI_POINTS_PER_REQUEST = 25000  # the UI endpoint's limit per response (MAX_HISTORY_RESULTS)
POINTS_PER_RUN = 2500  # the REST endpoint's limit per run and request (MAX_RESULTS_PER_RUN)

Curve = list[tuple[int, float]]


def read_histories(client: MlflowClient, run_ids: Sequence[str], metrics: Iterable[str]) -> dict[str, dict[str, Curve]]:
    """{run id: {metric: [(step, value), ...]}} for every run and metric (an empty list where it logged none). A step
    logged twice (a job re-run after an interruption logs its epochs again) keeps its latest value."""
    metrics = list(metrics)
    points: dict[str, dict[str, list[tuple[int, int, float]]]] = {
        run_id: {metric: [] for metric in metrics} for run_id in run_ids
    }
    if client.tracking_uri.startswith(("http://", "https://")):
        reader = _BulkReader(client.tracking_uri)
        for metric in metrics:
            for start in range(0, len(run_ids), RUNS_PER_REQUEST):
                for run_id, timestamp, step, value in reader.read(run_ids[start : start + RUNS_PER_REQUEST], metric):
                    if run_id in points:
                        points[run_id][metric].append((timestamp, step, value))
    else:
        for run_id in run_ids:
            for metric in metrics:
                points[run_id][metric] = [
                    (point.timestamp, point.step, point.value) for point in client.get_metric_history(run_id, metric)
                ]
    return {
        run_id: {metric: _latest_per_step(logged) for metric, logged in by_metric.items()}
        for run_id, by_metric in points.items()
    }


def _latest_per_step(points: list[tuple[int, int, float]]) -> Curve:
    by_step = {}
    for _, step, value in sorted(points, key=lambda point: (point[0], point[1])):
        by_step[step] = value
    return sorted(by_step.items())


class _BulkReader:
    """Bulk reads from one tracking server: the UI's endpoint while the server serves it, else the REST one."""

    def __init__(self, tracking_uri: str):
        self.server = ServerRequests(tracking_uri)
        self.ui_endpoint = True

    def read(self, run_ids: Sequence[str], metric: str) -> list[tuple[str, int, int, float]]:
        """(run id, timestamp, step, value) of `metric` in each of run_ids."""
        if self.ui_endpoint:
            points = self._get(UI_BULK_ENDPOINT, {"run_id": list(run_ids), "metric_key": metric})
            if points is None:
                self.ui_endpoint = False  # not served here: the REST endpoint from now on
            elif len(points) < UI_POINTS_PER_REQUEST:
                return points
            elif len(run_ids) > 1:  # full, so perhaps cut: fewer runs at a time
                half = len(run_ids) // 2
                return self.read(run_ids[:half], metric) + self.read(run_ids[half:], metric)
        # One run of more points than the UI endpoint returns, or a server without it: sampled to 2,500 per run.
        points = self._get(
            BULK_ENDPOINT, {"run_ids": list(run_ids), "metric_key": metric, "max_results": POINTS_PER_RUN}
        )
        assert points is not None  # the REST API's own endpoint: a 404 there is raised as an error
        return points

    def _get(self, endpoint: str, params: dict) -> list[tuple[str, int, int, float]] | None:
        answer = self.server.get(endpoint, params, missing_ok=endpoint == UI_BULK_ENDPOINT)
        if answer is None:
            return None
        return [
            (point["run_id"], int(point.get("timestamp", 0)), int(point.get("step", 0)), float(point["value"]))
            for point in answer.get("metrics", [])
        ]

"""A sweep's summary, read back from MLflow: one row per job (the parent run's children), written as
CSV, as a Markdown table, and as a PNG comparing the jobs' per-epoch curves."""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field

from mlflow.entities import RunStatus
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from runner.job_result import RESULT_KEYS
from runner.plots import plot_sweep_curves
from runner.sweeps.callback import JOB_NUMBER_TAG, OVERRIDES_TAG, SWEEP_DIR_TAG, WALL_SECONDS, run_name_for
from runner.tracking.common import ERROR_TAG

CSV_FILE = "sweep_summary.csv"
MARKDOWN_FILE = "sweep_summary.md"
CURVES_FILE = "sweep_curves.png"
CURVE_METRICS = ("test_accuracy", "test_loss", "train_loss")
_FINISHED = RunStatus.to_string(RunStatus.FINISHED)


@dataclass(frozen=True)
class JobRow:
    job: int
    overrides: str        # the overrides that vary in the sweep (the child run's name)
    all_overrides: str    # every task override of the job (its `overrides` tag)
    status: str
    metrics: dict[str, float]
    wall_seconds: float | None
    run_id: str
    error: str
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.status == _FINISHED


@dataclass(frozen=True)
class Summary:
    sweep: str
    parent_id: str
    objective: str
    rows: list[JobRow]
    best: JobRow | None

    @property
    def failed(self) -> list[JobRow]:
        return [row for row in self.rows if not row.finished]

    def markdown(self) -> str:
        header = ["job", "overrides", "status", *RESULT_KEYS, WALL_SECONDS]
        lines = [
            f"Sweep {self.sweep} (MLflow parent run {self.parent_id}): {len(self.rows)} jobs, "
            f"{len(self.rows) - len(self.failed)} finished, {len(self.failed)} failed",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "|".join("---:" if name in RESULT_KEYS or name in ("job", WALL_SECONDS) else "---"
                           for name in header) + "|",
        ]
        for row in self.rows:
            cells = [str(row.job), row.overrides.replace("|", "\\|"), row.status]
            cells += [_format(key, row.metrics.get(key)) for key in RESULT_KEYS]
            cells.append(_format(WALL_SECONDS, row.wall_seconds))
            lines.append("| " + " | ".join(cells) + " |")
        if self.best is not None:
            lines += ["", f"best {self.objective}: {_format(self.objective, self.best.metrics[self.objective])}, "
                          f"job {self.best.job} ({self.best.overrides})"]
        for row in self.failed:
            lines += ["", f"job {row.job} ({row.overrides}) {row.status}: {row.error or 'no error recorded'}"]
        return "\n".join(lines) + "\n"


def _format(key: str, value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if key in ("examples_per_second", WALL_SECONDS):
        return f"{value:.1f}"
    return f"{value:.4f}"


def _children(client: MlflowClient, parent_id: str):
    experiment_id = client.get_run(parent_id).info.experiment_id
    token = None
    while True:
        page = client.search_runs([experiment_id], f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent_id}'",
                                  max_results=1000, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def _curve(client: MlflowClient, run_id: str, metric: str) -> list[tuple[int, float]]:
    # A job re-run after an interruption logs its epochs again: the latest value per epoch wins.
    by_step = {}
    for point in sorted(client.get_metric_history(run_id, metric), key=lambda m: (m.timestamp, m.step)):
        by_step[point.step] = point.value
    return sorted(by_step.items())


def collect(client: MlflowClient, parent_id: str, objective: str, lower_is_better: bool) -> Summary:
    """One row per job number; if a job number has several children (its overrides changed between
    re-runs of the sweep directory), the most recently started one is the job."""
    latest = {}
    for run in _children(client, parent_id):
        number = int(run.data.tags.get(JOB_NUMBER_TAG, -1))
        if number not in latest or run.info.start_time > latest[number].info.start_time:
            latest[number] = run
    rows = []
    for number, run in sorted(latest.items()):
        metrics = run.data.metrics
        wall = metrics.get(WALL_SECONDS)
        if wall is None and run.info.end_time:
            wall = (run.info.end_time - run.info.start_time) / 1000
        rows.append(JobRow(
            job=number,
            overrides=run.info.run_name or "",
            all_overrides=run.data.tags.get(OVERRIDES_TAG, ""),
            status=run.info.status,
            metrics={key: metrics[key] for key in RESULT_KEYS if key in metrics},
            wall_seconds=wall,
            run_id=run.info.run_id,
            error=run.data.tags.get(ERROR_TAG, ""),
            curves={metric: _curve(client, run.info.run_id, metric) for metric in CURVE_METRICS},
        ))
    scored = [row for row in rows if row.finished and math.isfinite(row.metrics.get(objective, math.nan))]
    pick = min if lower_is_better else max
    best = pick(scored, key=lambda row: row.metrics[objective]) if scored else None
    sweep = run_name_for(client.get_run(parent_id).data.tags.get(SWEEP_DIR_TAG, "")) or parent_id
    return Summary(sweep, parent_id, objective, rows, best)


def write(summary: Summary, directory: str) -> list[str]:
    """Write the CSV, Markdown and PNG into directory; return their paths."""
    csv_path = os.path.join(directory, CSV_FILE)
    columns = ["job", "overrides", "status", *RESULT_KEYS, WALL_SECONDS, "run_id", "all_overrides", "error"]
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        for row in summary.rows:
            writer.writerow({"job": row.job, "overrides": row.overrides, "status": row.status, **row.metrics,
                             WALL_SECONDS: row.wall_seconds, "run_id": row.run_id,
                             "all_overrides": row.all_overrides, "error": row.error})
    markdown_path = os.path.join(directory, MARKDOWN_FILE)
    with open(markdown_path, "w") as handle:
        handle.write(summary.markdown())
    curves = {f"{row.job}: {row.overrides}": row.curves for row in summary.rows if any(row.curves.values())}
    png_path = plot_sweep_curves(curves, os.path.join(directory, CURVES_FILE), title=summary.sweep)
    return [csv_path, markdown_path, png_path]

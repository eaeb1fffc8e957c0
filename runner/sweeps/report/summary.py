"""A sweep's summary, read back from MLflow (the parent run's children): one row per configuration (the
jobs that differ only in `seed` and `fold`) with n, mean and standard deviation of each final metric, the
objective's 95% interval and its paired test against the best configuration, each naming its method
(runner.sweeps.uncertainty: Student's t or a bootstrap over seeds, Nadeau and Bengio's corrected t over folds),
and one row per job; each as CSV and Markdown, and a PNG of each configuration's mean curves with a min-max band.
The per-epoch histories are read in bulk (runner.sweeps.report.histories): through a tracking server, a few requests per
hundred runs."""

from __future__ import annotations

import csv
import math
import os
import statistics
from dataclasses import dataclass, field
from functools import cached_property

from mlflow.entities import Run, RunStatus
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from runner.config.objective import Constraint
from runner.metric_table import COST_KEYS, DEFAULT_TABLE, MetricTable, formatted
from runner.outcome import BEST_METRICS_STEP_TAG, STOPPED_AT_EPOCH_TAG
from runner.plots import plot_sweep_curves
from runner.sweeps.pareto import pareto_front
from runner.sweeps.report.histories import read_histories
from runner.sweeps.study.study import PRUNED_TAG
from runner.sweeps.terms import (
    CONFIGURATION_TAG,
    FOLD_TAG,
    JOB_NUMBER_TAG,
    OVERRIDES_TAG,
    SEED_KEY,
    SEED_TAG,
    STOPPED_EARLY_TAG,
    SWEEP_DIR_TAG,
    SWEPT_KEYS_TAG,
    WALL_SECONDS,
    chosen_on_test,
    run_name_for,
    what_chose,
)
from runner.sweeps.uncertainty import (
    BOOTSTRAP_FROM,
    LEVEL,
    Interval,
    PairedTest,
    compare_with_best,
    confidence_interval,
)
from runner.tracking.lifecycle import ERROR_TAG

CSV_FILE = "sweep_summary.csv"  # one row per configuration
MARKDOWN_FILE = "sweep_summary.md"
JOBS_CSV_FILE = "sweep_jobs.csv"  # one row per job (per seed)
JOBS_MARKDOWN_FILE = "sweep_jobs.md"
CURVES_FILE = "sweep_curves.png"
# The default experiment's: the PNG's curves, the HTML report's (runner.sweeps.report.report); a sweep's own are its
# table's (Summary.table).
CURVE_METRICS = DEFAULT_TABLE.curve_keys("test")
REPORT_CURVE_METRICS = DEFAULT_TABLE.curve_keys("val")
_FINISHED = RunStatus.to_string(RunStatus.FINISHED)


@dataclass(frozen=True)
class JobRow:
    job: int
    overrides: str  # the overrides that vary in the sweep (the child run's name)
    all_overrides: str  # every task override of the job (its `overrides` tag)
    status: str
    metrics: dict[str, float]
    wall_seconds: float | None
    run_id: str
    error: str
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    seed: str = ""  # the seed the run trained with
    configuration: str = ""  # its swept values without the seed: what it shares with the other seeds' runs
    pruned_at_epoch: int | None = None  # an Optuna trial its pruner stopped after this epoch
    stopped_at_epoch: int | None = None  # a run its early stopping ended after this epoch (a finished run)
    fold: str = ""  # with sweep.folds, the fold it held out
    swept: dict[str, str] = field(default_factory=dict)  # its values of the keys the sweep varies (not seed, fold)

    @property
    def replicate(self) -> tuple[str, str]:
        """What pairs it with a run of another configuration: the same seed and fold (the same split of the data
        and the same initial weights)."""
        return (self.seed, self.fold)

    @property
    def ended(self) -> bool:
        """FINISHED, whether it trained every epoch or was pruned."""
        return self.status == _FINISHED

    @property
    def finished(self) -> bool:
        """Trained every epoch: a pruned trial's numbers are never compared with these."""
        return self.ended and self.pruned_at_epoch is None

    @property
    def pruned(self) -> bool:
        return self.ended and self.pruned_at_epoch is not None

    @property
    def shown_status(self) -> str:
        if self.pruned:
            return f"pruned at epoch {self.pruned_at_epoch}"
        if self.stopped_at_epoch is not None and self.ended:
            return f"{self.status}, stopped early at epoch {self.stopped_at_epoch}"
        return self.status


@dataclass(frozen=True)
class ConfigurationRow:
    """The jobs of one configuration (one per seed); statistics over those that finished."""

    configuration: str
    jobs: list[JobRow]

    @cached_property
    def finished(self) -> list[JobRow]:
        """The runs that trained every epoch, one per (seed, fold): a second finished run of the same configuration,
        seed and fold (the same configuration proposed twice, or listed twice in a grid) is the same run again,
        never a replicate; the first is kept."""
        kept: dict[tuple[str, str], JobRow] = {}
        for job in self.jobs:
            if job.finished:
                kept.setdefault(job.replicate, job)
        return list(kept.values())

    @property
    def repeated(self) -> list[JobRow]:
        """Finished runs left out of `finished` as the same (seed, fold) again."""
        kept = {id(job) for job in self.finished}
        return [job for job in self.jobs if job.finished and id(job) not in kept]

    @property
    def n(self) -> int:
        """Distinct (seed, fold) runs that finished."""
        return len(self.finished)

    @property
    def replicate_count(self) -> int:
        """The configuration's runs, a repeated (seed, fold) counted once: what n is out of."""
        return len(self.jobs) - len(self.repeated)

    @property
    def complete(self) -> bool:
        """Every job ended and at least one trained every epoch (a pruned job is not waited for)."""
        return self.n > 0 and all(job.ended for job in self.jobs)

    @property
    def pruned(self) -> bool:
        """Every job was pruned: listed as such, never compared."""
        return bool(self.jobs) and all(job.pruned for job in self.jobs)

    def values(self, metric: str) -> list[float]:
        return [job.metrics[metric] for job in self.finished if metric in job.metrics]

    def mean(self, metric: str) -> float | None:
        values = self.values(metric)
        return statistics.fmean(values) if values else None

    def std(self, metric: str) -> float | None:
        """The sample standard deviation (n - 1 in the denominator); None for fewer than two values."""
        values = self.values(metric)
        return statistics.stdev(values) if len(values) >= 2 else None

    def replicates(self, metric: str) -> dict[tuple[str, str], float]:
        """The finished runs' final `metric` by (seed, fold): what a paired test matches."""
        return {job.replicate: job.metrics[metric] for job in self.finished if metric in job.metrics}

    def interval(self, metric: str, folds: int = 0) -> Interval:
        """The 95% interval of the mean over its seeds and folds, in a sweep of `folds` folds (0: seeds alone),
        clipped to the metric's range (runner.sweeps.uncertainty.confidence_interval); none for fewer than two
        values."""
        return confidence_interval(self.values(metric), folds, metric)

    def band(self, metric: str) -> list[tuple[int, float, float, float]]:
        """(epoch, mean, min, max) over the finished jobs' per-epoch values."""
        by_epoch: dict[int, list[float]] = {}
        for job in self.finished:
            for epoch, value in job.curves.get(metric, []):
                by_epoch.setdefault(epoch, []).append(value)
        return [
            (epoch, statistics.fmean(values), min(values), max(values)) for epoch, values in sorted(by_epoch.items())
        ]


@dataclass(frozen=True)
class Summary:
    sweep: str
    parent_id: str
    objective: str
    rows: list[JobRow]
    best: JobRow | None  # the best job of the best configuration: the run whose model stands for the sweep
    configurations: list[ConfigurationRow] = field(default_factory=list)
    best_configuration: ConfigurationRow | None = None  # the best mean objective among complete configurations
    asked: bool = True  # sweep.objective named the objective (False: the default, or its fallback on test)

    swept_keys: tuple[str, ...] = ()  # the keys the sweep varies, as the parent run names them (without seed, fold)
    stopped_early: str = ""  # why an Optuna study's terminator ended it before n_trials (STOPPED_EARLY_TAG)
    table: MetricTable = DEFAULT_TABLE  # the jobs' metrics (the sweep's `metrics`): the columns and curves
    # A sweep over several objectives: each (its name, whether lower is better), in sweep.objective's order; empty
    # for one objective.
    trade_off: tuple[tuple[str, bool], ...] = ()
    constraints: tuple[Constraint, ...] = ()  # what a configuration's means must hold to be chosen (sweep.constraints)

    @property
    def failed(self) -> list[JobRow]:
        return [row for row in self.rows if not row.ended]

    @property
    def all_failed(self) -> bool:
        """Every job failed: there is nothing to compare and no best."""
        return bool(self.rows) and len(self.failed) == len(self.rows)

    @property
    def folds(self) -> int:
        """The sweep's number of folds (K of sweep.folds, as its runs carry them); 0 for a sweep without folds. A
        sweep whose runs so far hold one fold gives 1: its runs share one split, so they count as seeds alone."""
        return len({row.fold for row in self.rows if row.fold})

    def interval(self, row: ConfigurationRow) -> Interval:
        """The configuration's interval of its mean objective, by the method its sweep's folds call for."""
        return row.interval(self.objective, self.folds)

    def comparisons(self) -> dict[str, PairedTest]:
        """Each complete configuration but the best, by name: its paired test against the best configuration
        over their matched seeds and folds (corrected for the folds' overlap), Holm-corrected across them
        (runner.sweeps.uncertainty)."""
        best = self.best_configuration
        if best is None:
            return {}
        others = {
            row.configuration: row.replicates(self.objective)
            for row in self.configurations
            if row is not best and row.complete and not row.pruned
        }
        return compare_with_best(best.replicates(self.objective), others, self.folds)

    def winner_tests(self) -> list[tuple[str, float, float | None, Interval]]:
        """The best configuration's test value of every metric of the task (its scores, then its loss): (key, mean,
        standard deviation, interval of the mean) over its finished runs, for each key they hold; empty without a
        best configuration."""
        best = self.best_configuration
        if best is None:
            return []
        tests = []
        for key in self.table.split_keys("test"):
            mean = best.mean(key)
            if mean is not None:
                tests.append((key, mean, best.std(key), best.interval(key, self.folds)))
        return tests

    def winner_costs(self) -> list[tuple[str, float, float | None]]:
        """What the best configuration's models cost (runner.metric_table.COST): (key, mean, standard deviation) over
        its finished runs, for each cost they logged; empty without a best configuration."""
        best = self.best_configuration
        if best is None:
            return []
        return [(key, mean, best.std(key)) for key in COST_KEYS if (mean := best.mean(key)) is not None]

    def broken(self, row: ConfigurationRow) -> list[str]:
        """The constraints the configuration's means break, in words (broken_constraints)."""
        return broken_constraints(row, self.constraints)

    def feasible(self, row: ConfigurationRow) -> bool:
        return not self.broken(row)

    @cached_property
    def front(self) -> list[ConfigurationRow]:
        """With several objectives: the configurations no other beats on every objective's mean, among those that
        finished every run, hold every constraint and have each objective (in the order they are listed); empty
        for one objective."""
        if not self.trade_off:
            return []
        candidates = {
            row.configuration: row
            for row in self.configurations
            if row.complete
            and not row.pruned
            and self.feasible(row)
            and all(row.mean(name) is not None for name, _ in self.trade_off)
        }
        points = {name: [row.mean(key) or 0.0 for key, _ in self.trade_off] for name, row in candidates.items()}
        return [candidates[name] for name in pareto_front(points, [lower for _, lower in self.trade_off])]

    def verdict(self, row: ConfigurationRow, comparisons: dict[str, PairedTest]) -> str:
        """In words, how the configuration compares with the best one (and, with several objectives, whether it is
        on the Pareto front)."""
        said = self._verdict(row, comparisons)
        if self.trade_off and any(row is member for member in self.front):
            said += "; on the Pareto front"
        return said

    def _verdict(self, row: ConfigurationRow, comparisons: dict[str, PairedTest]) -> str:
        if row is self.best_configuration:
            return "the best"
        if row.pruned:
            return "pruned: not compared"
        broken = self.broken(row) if row.complete else []
        if broken:
            return "infeasible (sweep.constraints): " + ", ".join(broken)
        if row.configuration not in comparisons:
            return "not compared (a run did not finish)" if row.n else "no finished run"
        return comparisons[row.configuration].verdict()

    @property
    def pruned(self) -> list[JobRow]:
        return [row for row in self.rows if row.pruned]

    def _heading(self) -> str:
        finished = len(self.rows) - len(self.failed) - len(self.pruned)
        return (
            f"Sweep {self.sweep} (MLflow parent run {self.parent_id}): {len(self.rows)} jobs, {finished} finished, "
            + (f"{len(self.pruned)} pruned, " if self.pruned else "")
            + f"{len(self.failed)} failed, in {len(self.configurations)} configurations"
        )

    def markdown(self) -> str:
        """The configurations: n and mean ± standard deviation of each final metric, then the best one."""
        interval = f"{self.objective} {LEVEL:.0%} CI"
        header = ["configuration", "n", *self.table.result_keys, WALL_SECONDS, interval, "compared with the best"]
        comparisons = self.comparisons()
        lines = [
            self._heading(),
            "",
            "| " + " | ".join(header) + " |",
            "|---|---:|" + "|".join("---:" for _ in header[2:-1]) + "|---|",
        ]
        lines += [self._configuration_line(row, comparisons, len(header)) for row in self.configurations]
        lines += [
            "",
            "Each cell: mean ± sample standard deviation over the n runs that finished (its seeds and "
            f"folds); {interval}: {methods()}",
        ]
        if self.all_failed:
            lines += ["", every_job_failed(len(self.rows), self.objective)]
        if self.stopped_early:
            lines += ["", f"Ended early: {self.stopped_early}."]
        lines += self._repeated_and_pruned_lines() + self._constraint_lines() + self._front_lines() + self._best_lines()
        for job in self.failed:
            lines += ["", f"job {job.job} ({job.overrides}) {job.status}: {job.error or 'no error recorded'}"]
        return "\n".join(lines) + "\n"

    def _configuration_line(self, row: ConfigurationRow, comparisons: dict[str, PairedTest], columns: int) -> str:
        if row.pruned:
            epochs = sorted({job.pruned_at_epoch for job in row.jobs if job.pruned_at_epoch is not None})
            shown = "pruned at epoch " + ", ".join(map(str, epochs))
            return "| " + " | ".join([_cell(row.configuration), shown] + [""] * (columns - 2)) + " |"
        out_of = "" if row.n == row.replicate_count else f" of {row.replicate_count}"
        cells = [_cell(row.configuration), f"{row.n}{out_of}"]
        cells += [_mean_std(key, row.mean(key), row.std(key)) for key in self.table.result_keys]
        walls = [job.wall_seconds for job in row.finished if job.wall_seconds is not None]
        cells.append(_format(WALL_SECONDS, statistics.fmean(walls) if walls else None))
        cells.append(_interval(self.objective, self.interval(row)))
        cells.append(self.verdict(row, comparisons))
        return "| " + " | ".join(cells) + " |"

    def _repeated_and_pruned_lines(self) -> list[str]:
        lines = []
        repeated = [job for row in self.configurations for job in row.repeated]
        if repeated:
            lines += [
                "",
                f"{len(repeated)} repeated: "
                + "; ".join(f"job {job.job} ({job.overrides})" for job in repeated)
                + " trained a configuration, seed and fold an earlier job had trained: not counted again in n",
            ]
        if self.pruned:
            lines += [
                "",
                f"{len(self.pruned)} pruned: "
                + "; ".join(f"job {job.job} ({job.overrides}) at epoch {job.pruned_at_epoch}" for job in self.pruned)
                + " (stopped early by the study's pruner, never the best)",
            ]
        return lines

    def _constraint_lines(self) -> list[str]:
        if not self.constraints:
            return []
        infeasible = [row for row in self.configurations if row.complete and not row.pruned and not self.feasible(row)]
        said = "; ".join(f"{row.configuration} ({', '.join(self.broken(row))})" for row in infeasible)
        return [
            "",
            "constraints (sweep.constraints, on each configuration's means): "
            + ", ".join(map(str, self.constraints))
            + (f"; infeasible, never chosen: {said}" if infeasible else "; every configuration holds them"),
        ]

    def _front_lines(self) -> list[str]:
        """The Pareto front: each configuration on it with its mean ± standard deviation, interval and n of every
        objective."""
        if not self.trade_off:
            return []
        objectives = " and ".join(
            f"{name} ({'lower' if lower else 'higher'} is better)" for name, lower in self.trade_off
        )
        lines = ["", f"Pareto front over {objectives}: {len(self.front)} configuration(s) no other beats on every one"]
        for row in self.front:
            values = [
                f"{key} {_mean_std(key, row.mean(key), row.std(key))} {_interval(key, row.interval(key, self.folds))}"
                for key, _ in self.trade_off
            ]
            lines.append(f"- {row.configuration} (n={row.n}): " + ", ".join(values))
        return lines

    def _best_lines(self) -> list[str]:
        """The best configuration, its best job, what chose it and, chosen on validation, its test metrics."""
        best = self.best_configuration
        if best is None:
            return []
        spread = best.std(self.objective)
        lines = [
            "",
            f"best {self.objective}: {_format(self.objective, best.mean(self.objective))}"
            + (f" ± {_format(self.objective, spread)}" if spread is not None else "")
            + f" (mean of {best.n}), configuration {best.configuration}",
        ]
        if self.best is not None:
            lines.append(
                f"best job of that configuration: job {self.best.job} ({self.best.overrides}), "
                f"{self.objective} {_format(self.objective, self.best.metrics[self.objective])}"
            )
        lines += ["", what_chose(self.objective, self.asked)]
        if self.trade_off:
            lines.append(
                f"with several objectives, the configuration with the best mean {self.objective} among those that "
                "hold the constraints (always on the Pareto front) is chosen, registered and compared with the "
                "champion (sweep.choose names another objective to decide)"
            )
        reported = [
            f"{key} {_mean_std(key, mean, std)} {_interval(key, interval)}"
            for key, mean, std, interval in self.winner_tests()
        ]
        if reported:
            caveat = " (optimistic: the test set chose the winner)" if chosen_on_test(self.objective) else ""
            lines.append(
                f"the winner's test metrics{caveat}, mean ± standard deviation over its {best.n} run(s) and the "
                f"{LEVEL:.0%} CI of the mean: " + ", ".join(reported)
            )
        costs = [f"{key} {_mean_std(key, mean, std)}" for key, mean, std in self.winner_costs()]
        if costs:
            over = f"mean ± standard deviation over its {best.n} run(s)"
            lines.append(f"what the winner's models cost, {over}: " + ", ".join(costs))
        return lines

    def jobs_markdown(self) -> str:
        """One row per job: its final numbers, wall time and status."""
        keys = self.table.result_keys
        header = ["job", "overrides", "status", *keys, WALL_SECONDS]
        lines = [
            f"Jobs of sweep {self.sweep}",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "|".join("---:" if name in keys or name in ("job", WALL_SECONDS) else "---" for name in header) + "|",
        ]
        for row in self.rows:
            cells = [str(row.job), _cell(row.overrides), row.shown_status]
            cells += [_format(key, row.metrics.get(key)) for key in keys]
            cells.append(_format(WALL_SECONDS, row.wall_seconds))
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _format(key: str, value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if key == WALL_SECONDS:
        return f"{value:.1f}"
    return formatted(key, value)


def _interval(key: str, interval: Interval) -> str:
    """`[0.7145, 0.9122] (Student-t (n=3))`; without bounds, why (`n = 1: no interval`), or nothing for no run."""
    if interval.bounds is None:
        return interval.method if interval.n else ""
    return f"[{_format(key, interval.bounds[0])}, {_format(key, interval.bounds[1])}] ({interval.method})"


def methods() -> str:
    """How the intervals and the comparisons are made, in one paragraph (the summary's and the report's)."""
    return (
        "the interval of the mean, by the method named beside it: with folds, the corrected resampled t of Nadeau "
        "& Bengio (Inference for the Generalization Error, Machine Learning 52, 2003), whose variance "
        "s²·(1/n + 1/(K-1)) allows for the K folds' overlapping training sets (a plain t over folds is "
        "anti-conservative: Bouckaert & Frank, PAKDD 2004); over seeds alone, Student's t, or from "
        f"{BOOTSTRAP_FROM} runs on a seeded percentile bootstrap; clipped to what the metric can be (an accuracy to "
        "[0, 1], a loss to 0 and above). Compared with the best: a paired t-test over the runs with the same seed "
        "and fold, with folds corrected the same way, its p-values Holm-adjusted across the configurations."
    )


def every_job_failed(jobs: int, objective: str) -> str:
    """What the summary and the report say of a sweep none of whose jobs finished."""
    return (
        f"Every job failed ({jobs} of {jobs}): no configuration has a {objective}, so none is the best and none "
        "is compared; each job's error is below."
    )


def _mean_std(key: str, mean: float | None, std: float | None) -> str:
    if mean is None:
        return ""
    return _format(key, mean) + (f" ± {_format(key, std)}" if std is not None else "")


def _children(client: MlflowClient, parent_id: str):
    experiment_id = client.get_run(parent_id).info.experiment_id
    token = None
    while True:
        page = client.search_runs(
            [experiment_id], f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent_id}'", max_results=1000, page_token=token
        )
        yield from page
        token = page.token
        if not token:
            return


def _configuration_of(run) -> str:
    """The child's configuration tag; for a run without one, its name without the `seed=` item."""
    if CONFIGURATION_TAG in run.data.tags:
        return run.data.tags[CONFIGURATION_TAG]
    items = (run.info.run_name or "").split(",")
    return ",".join(item for item in items if not item.startswith(f"{SEED_KEY}=")) or (run.info.run_name or "")


def collect(
    client: MlflowClient,
    parent_id: str,
    objective: str,
    lower_is_better: bool,
    fallback: str | None = None,
    asked: bool = True,
    table: MetricTable = DEFAULT_TABLE,
    trade_off: tuple[tuple[str, bool], ...] = (),
    constraints: tuple[Constraint, ...] = (),
) -> Summary:
    """One row per (job number, seed, fold); configurations group the rows, the best is picked among those that
    finished. `fallback`: the objective where no finished job has `objective` (the default val_accuracy over data
    that could not be split: the test set chooses, and the summary says so). `asked`: sweep.objective named it."""
    parent = client.get_run(parent_id)
    swept_keys = tuple(
        key for key in parent.data.tags.get(SWEPT_KEYS_TAG, "").split(",") if key and key not in (SEED_KEY, FOLD_TAG)
    )
    rows = _job_rows(client, _latest_children(client, parent_id), swept_keys, table)
    finished = [row for row in rows if row.finished]
    # Only finished jobs tell whether the data could be split: where none finished, the objective stays as asked.
    if fallback is not None and finished and not any(objective in row.metrics for row in finished):
        objective, asked = fallback, False
    grouped: dict[str, list[JobRow]] = {}
    for row in rows:
        grouped.setdefault(row.configuration, []).append(row)
    configurations = [ConfigurationRow(name, jobs) for name, jobs in grouped.items()]
    feasible = [row for row in configurations if not broken_constraints(row, constraints)]
    best_configuration = _best_configuration(feasible, objective, lower_is_better)
    configurations = _ranked(configurations, best_configuration, objective, lower_is_better)
    best = None
    if best_configuration is not None:
        pick = min if lower_is_better else max
        best = pick(best_configuration.finished, key=lambda row: row.metrics[objective])
    sweep = run_name_for(parent.data.tags.get(SWEEP_DIR_TAG, "")) or parent_id
    stopped = parent.data.tags.get(STOPPED_EARLY_TAG, "")
    return Summary(
        sweep,
        parent_id,
        objective,
        rows,
        best,
        configurations,
        best_configuration,
        asked,
        swept_keys,
        stopped,
        table,
        trade_off,
        constraints,
    )


def _latest_children(client: MlflowClient, parent_id: str) -> list[tuple[tuple[int, str, str], Run]]:
    """The parent's children by (job number, seed, fold), in that order; where one has several (its overrides
    changed between re-runs of the sweep directory), the most recently started."""
    latest: dict[tuple[int, str, str], Run] = {}
    for run in _children(client, parent_id):
        key = (
            int(run.data.tags.get(JOB_NUMBER_TAG, -1)),
            run.data.tags.get(SEED_TAG, run.data.params.get(SEED_KEY, "")),
            run.data.tags.get(FOLD_TAG, ""),  # with sweep.folds, a run per fold
        )
        if key not in latest or run.info.start_time > latest[key].info.start_time:
            latest[key] = run
    return sorted(latest.items(), key=lambda item: (item[0][0], _seed_order(item[0][1]), _seed_order(item[0][2])))


def _job_rows(
    client: MlflowClient,
    children: list[tuple[tuple[int, str, str], Run]],
    swept_keys: tuple[str, ...],
    table: MetricTable,
) -> list[JobRow]:
    # A job re-run after an interruption logs its epochs again: the latest value per epoch wins.
    drawn = dict.fromkeys(table.curve_keys("test") + table.curve_keys("val"))
    curves = read_histories(client, [run.info.run_id for _, run in children], drawn)
    rows = []
    for (number, seed, fold), run in children:
        metrics = run.data.metrics
        wall = metrics.get(WALL_SECONDS)
        if wall is None and run.info.end_time:
            wall = (run.info.end_time - run.info.start_time) / 1000
        rows.append(
            JobRow(
                job=number,
                overrides=run.info.run_name or "",
                all_overrides=run.data.tags.get(OVERRIDES_TAG, ""),
                status=run.info.status,
                metrics={key: metrics[key] for key in table.result_keys if key in metrics},
                wall_seconds=wall,
                run_id=run.info.run_id,
                error=run.data.tags.get(ERROR_TAG, ""),
                curves=_epochs_only(curves[run.info.run_id], run),
                seed=seed,
                configuration=_configuration_of(run),
                pruned_at_epoch=_epoch_tag(run, PRUNED_TAG),
                stopped_at_epoch=_epoch_tag(run, STOPPED_AT_EPOCH_TAG),
                fold=fold,
                swept={key: value for key in swept_keys if (value := _swept_value(run, key)) is not None},
            )
        )
    return rows


def broken_constraints(row: ConfigurationRow, constraints: tuple[Constraint, ...]) -> list[str]:
    """The constraints the configuration's means break, in words (`parameters 121930 > 100000`); a constraint on a
    metric its runs lack is broken too."""
    said = []
    for constraint in constraints:
        mean = row.mean(constraint.metric)
        if not constraint.holds(mean):
            shown = "none" if mean is None else _format(constraint.metric, mean)
            other = ">" if constraint.operator == "<=" else "<"
            said.append(f"{constraint.metric} {shown} {other} {constraint.bound:g}")
    return said


def _best_configuration(
    configurations: list[ConfigurationRow], objective: str, lower_is_better: bool
) -> ConfigurationRow | None:
    """The complete configuration with the best mean objective. A configuration with a failed seed is never the
    best, as its job's objective is then the worst value."""

    def score(row: ConfigurationRow) -> float:
        mean = row.mean(objective)
        return math.nan if mean is None else mean

    scored = [row for row in configurations if row.complete and math.isfinite(score(row))]
    pick = min if lower_is_better else max
    return pick(scored, key=score) if scored else None


def _ranked(
    configurations: list[ConfigurationRow], best: ConfigurationRow | None, objective: str, lower_is_better: bool
) -> list[ConfigurationRow]:
    """The order every output lists configurations in: the best first, then the compared ones from best to worst
    mean, then those that cannot be compared (pruned, or without a finished run of every seed and fold), in job
    order."""

    def key(row: ConfigurationRow) -> tuple[bool, bool, float]:
        mean = row.mean(objective)
        if mean is None or not row.complete or row.pruned:
            return (True, True, 0.0)
        return (row is not best, False, mean if lower_is_better else -mean)

    return sorted(configurations, key=key)


def _swept_value(run, key: str) -> str | None:
    """The run's value of a swept key: its `key=value` item in the run's name (as the command line gave it: a
    config group's option too), else its logged parameter."""
    for item in (run.info.run_name or "").split(","):
        name, equals, value = item.partition("=")
        if equals and name.lstrip("+~") == key:
            return value
    return run.data.params.get(key)


def _epochs_only(curves: dict[str, list[tuple[int, float]]], run) -> dict[str, list[tuple[int, float]]]:
    """A run's curves without the best epoch's metrics logged again after its last epoch (checkpoint.keep_best)."""
    after_last = _epoch_tag(run, BEST_METRICS_STEP_TAG)
    if after_last is None:
        return curves
    return {metric: [point for point in points if point[0] < after_last] for metric, points in curves.items()}


def _epoch_tag(run, tag: str) -> int | None:
    value = run.data.tags.get(tag, "")
    return int(value) if value.isdigit() else None


def _seed_order(seed: str):
    return (0, int(seed)) if seed.lstrip("-").isdigit() else (1, seed)


def write(summary: Summary, directory: str) -> list[str]:
    """Write the configurations' and the jobs' CSV and Markdown, and the PNG, into directory; return their paths."""
    paths = [_write_configurations_csv(summary, directory), _write_jobs_csv(summary, directory)]
    for name, text in ((MARKDOWN_FILE, summary.markdown()), (JOBS_MARKDOWN_FILE, summary.jobs_markdown())):
        paths.append(os.path.join(directory, name))
        with open(paths[-1], "w") as handle:
            handle.write(text)
    drawn = summary.table.curve_keys("test")
    bands = {
        f"{row.configuration} (n={row.n})": {metric: row.band(metric) for metric in drawn}
        for row in summary.configurations
        if row.n
    }
    path = os.path.join(directory, CURVES_FILE)
    paths.append(plot_sweep_curves(bands, path, title=summary.sweep, score=drawn[0] if summary.table.scores else None))
    return paths


def _write_configurations_csv(summary: Summary, directory: str) -> str:
    """sweep_summary.csv: a row per configuration, its statistics, interval and comparison with the best."""
    path = os.path.join(directory, CSV_FILE)
    stats = [f"{key}_{stat}" for key in summary.table.result_keys for stat in ("mean", "std")]
    objective = summary.objective
    low, high, method = f"{objective}_ci95_low", f"{objective}_ci95_high", f"{objective}_ci95_method"
    columns = ["configuration", "n", "jobs", *stats, "run_ids", "objective", low, high, method, "compared_with_best"]
    columns += ["feasible"] if summary.constraints else []
    columns += ["pareto_front"] if summary.trade_off else []
    comparisons = summary.comparisons()
    front = {row.configuration for row in summary.front}
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        for row in summary.configurations:
            values: dict[str, object] = {"configuration": row.configuration, "n": row.n, "jobs": row.replicate_count}
            for key in summary.table.result_keys:
                values[f"{key}_mean"], values[f"{key}_std"] = row.mean(key), row.std(key)
            interval = summary.interval(row)
            values[low], values[high] = interval.bounds or (None, None)
            values[method] = interval.method if interval.n else None
            values["objective"] = objective
            values["compared_with_best"] = summary.verdict(row, comparisons)
            values["run_ids"] = " ".join(job.run_id for job in row.finished)
            if summary.constraints:
                values["feasible"] = summary.feasible(row)
            if summary.trade_off:
                values["pareto_front"] = row.configuration in front
            writer.writerow(values)
    return path


_JOB_COLUMNS = ["job", "seed", "configuration", "overrides", "status", PRUNED_TAG, STOPPED_AT_EPOCH_TAG]


def _write_jobs_csv(summary: Summary, directory: str) -> str:
    """sweep_jobs.csv: a row per job (per seed and fold), its final numbers and how it ended."""
    path = os.path.join(directory, JOBS_CSV_FILE)
    with open(path, "w", newline="") as handle:
        columns = [*_JOB_COLUMNS, *summary.table.result_keys, WALL_SECONDS, "run_id", "all_overrides", "error"]
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        for job in summary.rows:
            writer.writerow(
                {
                    "job": job.job,
                    "seed": job.seed,
                    "configuration": job.configuration,
                    "overrides": job.overrides,
                    "status": job.status,
                    PRUNED_TAG: job.pruned_at_epoch,
                    STOPPED_AT_EPOCH_TAG: job.stopped_at_epoch,
                    **job.metrics,
                    WALL_SECONDS: job.wall_seconds,
                    "run_id": job.run_id,
                    "all_overrides": job.all_overrides,
                    "error": job.error,
                }
            )
    return path

"""A sweep's report, `sweep_report.html`: one self-contained page (Plotly's JavaScript inlined, no network) that
says which configurations the sweep could tell apart.

It shows the configurations with the objective's mean and 95% interval over seeds and folds, each one's paired test
against the best, each naming its method (runner.sweeps.uncertainty), the swept values against the objective as
parallel coordinates (a log axis for a value swept on a log scale), each configuration's validation and training
curves with a min-max band over its seeds and folds, the pruned and failed runs, and for an Optuna sweep its
parameter importances. The page is deterministic (a seeded bootstrap, fixed element ids, a fixed fANOVA seed): two
reports of the same runs differ only in their `Generated` line, so a report rebuilt elsewhere
(`python -m runner.report`) can be compared with the sweep's own."""

from __future__ import annotations

import datetime
import html
import itertools
import math
import os
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import optuna
import plotly.graph_objects as go  # type: ignore[import-untyped]  # plotly ships no type information
from omegaconf import OmegaConf
from optuna.importance import FanovaImportanceEvaluator
from optuna.trial import TrialState
from plotly.offline import get_plotlyjs  # type: ignore[import-untyped]  # plotly ships no type information

from runner.config.settings import optuna_sweeper_settings
from runner.errors import RunnerError
from runner.metric_table import formatted
from runner.sweeps.report.summary import JobRow, Summary, every_job_failed, methods
from runner.sweeps.study.study import is_optuna_sweep, open_storage
from runner.sweeps.sweep_config import StudyAddress
from runner.sweeps.terms import JOURNAL_FILE, chosen_on_test, what_chose
from runner.sweeps.uncertainty import ALPHA, LEVEL, Interval

LOG_DECADES = 2  # positive values spanning more than this many decades get a log axis
_PAD = 0.05  # of an axis's span, beyond its lowest and highest line: no line runs hidden along the frame

REPORT_FILE = "sweep_report.html"
GENERATED_PREFIX = '<p class="generated">Generated '  # the one line that differs between two reports of the same runs
_COLORS = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff", "#fecb52")
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
td.number { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.best { background: #e8f5e9; } tr.worse { color: #888; } tr.pruned, tr.failed { background: #fff3e0; }
.note { color: #555; max-width: 60em; }
"""


def find_study(sweep_dir: str, given: Mapping[str, str], config: Any = None) -> StudyAddress | None:
    """An Optuna sweep's study, found from what the sweep left: its composed config (`config`, which the sweep's
    own end holds; else the sweep directory's multirun.yaml, where Hydra writes it), else `hydra.sweeper.storage=`
    and `hydra.sweeper.study_name=` among the command's overrides (`given`: the parent's `overrides` tag, by key),
    else the default journal file in the sweep directory. Where the name is not known, the storage's only study is
    the one (_importances)."""

    multirun = os.path.join(sweep_dir, "multirun.yaml")
    if config is None and os.path.exists(multirun):
        config = OmegaConf.load(multirun)
    if config is not None:
        if not is_optuna_sweep(config):
            return None
        return StudyAddress.of(optuna_sweeper_settings(config.hydra.sweeper), sweep_dir)
    name = given.get("hydra.sweeper.study_name", "")
    storage = given.get("hydra.sweeper.storage")
    if storage and storage != "null":
        return StudyAddress(storage if "://" in storage else os.path.join(sweep_dir, storage), name)
    journal = os.path.join(sweep_dir, JOURNAL_FILE)
    return StudyAddress(journal, name) if os.path.exists(journal) else None


def given_overrides(overrides: str) -> dict[str, str]:
    """A parent run's `overrides` tag (the command line's overrides, space-separated) by key."""
    return dict(item.partition("=")[::2] for item in overrides.split() if "=" in item)


def log_scaled_keys(config: Any, overrides: str = "") -> set[str]:
    """The keys swept on a log scale, `tag(log, ...)`: in the sweeper's search space (hydra.sweeper.params of the
    composed config, where there is one) or on the command line (`overrides`: the parent's overrides tag, or the
    config's hydra.overrides.task)."""

    swept: dict[str, str] = {}
    if config is not None:
        params = OmegaConf.select(config, "hydra.sweeper.params") or {}
        swept.update({str(key): str(value) for key, value in params.items()})
        overrides = " ".join([overrides, *(OmegaConf.select(config, "hydra.overrides.task") or [])])
    # An override's value holds spaces (`lr=tag(log, interval(1e-5, 1e-1))`), so the tag is found by pattern.
    swept.update({key: "tag(log" for key in re.findall(r"(?:^|\s)[+~]*([\w.\-/]+)=tag\(\s*log\b", overrides)})
    return {key for key, value in swept.items() if re.match(r"tag\(\s*log\b", value.strip())}


def write_report(
    summary: Summary,
    directory: str,
    sweep_dir: str,
    lower_is_better: bool,
    study: StudyAddress | None = None,
    log_keys: Collection[str] = (),
) -> str:
    """Write sweep_report.html into directory; return its path. `log_keys`: the keys swept on a log scale
    (log_scaled_keys), drawn on a log axis."""

    sections = [
        _heading(summary, sweep_dir, lower_is_better),
        _configurations_table(summary),
        _winner_tests(summary),
        _winner_costs(summary),
        _trade_off(summary),
        _parallel_coordinates(summary, log_keys),
        _curves(summary),
        _jobs_table(summary),
        _importances(study),
    ]
    generated = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    page = "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>Sweep report: {html.escape(os.path.basename(sweep_dir.rstrip('/')) or summary.parent_id)}</title>",
            f"<style>{_STYLE}</style>",
            f'<script type="text/javascript">{get_plotlyjs()}</script>',
            "</head><body>",
            *sections,
            f"{GENERATED_PREFIX}{generated} from MLflow parent run {html.escape(summary.parent_id)}.</p>",
            "</body></html>",
            "",
        ]
    )
    path = os.path.join(directory, REPORT_FILE)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page)
    return path


def _figure_html(figure, div_id: str) -> str:
    # No plotly.js here (the page loads it once); a fixed id, so that the page is the same for the same runs.
    return figure.to_html(
        full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False, "responsive": True}
    )


def _format(value: float | None, key: str = "") -> str:
    """`value` as the summaries write the metric `key` (four decimals for a key of no format of its own)."""
    return "" if value is None or math.isnan(value) else formatted(key, value)


def _heading(summary: Summary, sweep_dir: str, lower_is_better: bool) -> str:
    finished = [row for row in summary.rows if row.finished]
    direction = "lower is better" if lower_is_better else "higher is better"
    counts = (
        f"{len(summary.rows)} runs in {len(summary.configurations)} configurations: {len(finished)} finished, "
        f"{len(summary.pruned)} pruned, {len(summary.failed)} failed."
    )
    chose = (
        every_job_failed(len(summary.rows), summary.objective)
        if summary.all_failed
        else what_chose(summary.objective, summary.asked)
    )
    return (
        f"<h1>Sweep report</h1>\n<p>Sweep directory <code>{html.escape(sweep_dir)}</code>, MLflow parent run "
        f"<code>{html.escape(summary.parent_id)}</code>. {counts}</p>\n"
        f"<p>Objective: <b>{html.escape(summary.objective)}</b> ({direction}). {html.escape(chose)}</p>"
    )


def _configurations_table(summary: Summary) -> str:
    objective = summary.objective
    comparisons = summary.comparisons()
    rows = []
    for row in summary.configurations:  # ranked: the best first (runner.sweeps.report.summary)
        mean, std = row.mean(objective), row.std(objective)
        verdict = summary.verdict(row, comparisons)
        test = comparisons.get(row.configuration)
        css = (
            "best"
            if row is summary.best_configuration
            else "pruned"
            if row.pruned
            else "failed"
            if any(not job.ended for job in row.jobs)
            else "worse"
            if test is not None and test.distinguishable
            else ""
        )
        states = [job.shown_status for job in row.jobs if not job.finished]
        rows.append(
            f'<tr class="{css}"><td>{html.escape(row.configuration)}</td>'
            f'<td class="number">{row.n} of {row.replicate_count}</td>'
            f'<td class="number">{_format(mean)}</td><td class="number">{_format(std)}</td>'
            f"{_interval_cells(summary.interval(row))}"
            f"<td>{html.escape(verdict)}</td><td>{html.escape('; '.join(states))}</td></tr>"
        )
    return (
        "<h2>Configurations</h2>\n<table><thead><tr><th>configuration</th><th>n</th>"
        f"<th>{html.escape(objective)} mean</th><th>std</th><th>{LEVEL:.0%} CI of the mean</th>"
        "<th>interval's method</th><th>compared with the best</th><th>runs not finished</th></tr></thead><tbody>\n"
        + "\n".join(rows)
        + "\n</tbody></table>\n"
        f'<p class="note">n: the runs (seeds &times; folds) that trained every epoch; none has an interval or a '
        f"test with fewer than two. {LEVEL:.0%} CI: {html.escape(methods())} <i>worse than the best</i> means the "
        f"Holm-adjusted p is below {ALPHA}; <i>indistinguishable from the best</i> means these runs cannot tell the "
        "two apart: it is not evidence that they are equal, only that more seeds or folds would be needed to "
        "separate them. Pruned and failed runs are never compared.</p>"
    )


def _winner_tests(summary: Summary) -> str:
    """The winner's test value of every metric of the task, as the heading's sentence promises; nothing without a
    winner."""
    tests = summary.winner_tests()
    best = summary.best_configuration
    if not tests or best is None:
        return ""
    rows = [
        f'<tr><td>{html.escape(key)}</td><td class="number">{_format(mean)}</td>'
        f'<td class="number">{_format(std)}</td>{_interval_cells(interval)}</tr>'
        for key, mean, std, interval in tests
    ]
    caveat = " The test set chose the winner, so these are optimistic." if chosen_on_test(summary.objective) else ""
    return (
        f"<h2>The winner's test metrics</h2>\n<p>Configuration <b>{html.escape(best.configuration)}</b>, over its "
        f"{best.n} finished run(s).{caveat}</p>\n<table><thead><tr><th>metric</th><th>mean</th><th>std</th>"
        f"<th>{LEVEL:.0%} CI of the mean</th><th>interval's method</th></tr></thead><tbody>\n"
        + "\n".join(rows)
        + "\n</tbody></table>"
    )


def _winner_costs(summary: Summary) -> str:
    """What the winner's models cost (runner.metric_table.COST); nothing without a winner."""
    costs = summary.winner_costs()
    best = summary.best_configuration
    if not costs or best is None:
        return ""
    rows = [
        f'<tr><td>{html.escape(key)}</td><td class="number">{_format(mean, key)}</td>'
        f'<td class="number">{_format(std, key)}</td></tr>'
        for key, mean, std in costs
    ]
    return (
        f"<h2>What the winner's models cost</h2>\n<p>Configuration <b>{html.escape(best.configuration)}</b>, over "
        f"its {best.n} finished run(s): its parameters, its exported model's size, the served model's latency per "
        "example and examples per second (the median of timed calls on one batch of the test split, after a "
        "warm-up), and the seconds its epochs trained. Lower is better for each but the served examples per "
        "second.</p>\n<table><thead><tr><th>cost</th><th>mean</th><th>std</th></tr></thead><tbody>\n"
        + "\n".join(rows)
        + "\n</tbody></table>"
    )


def _interval_cells(interval: Interval) -> str:
    """The interval's cell and its method's beside it; for one run, `n = 1: no interval` in the interval's own."""
    if interval.bounds is None:
        return f'<td class="number">{html.escape(interval.method if interval.n else "")}</td><td></td>'
    low, high = interval.bounds
    return f'<td class="number">[{_format(low)}, {_format(high)}]</td><td>{html.escape(interval.method)}</td>'


def _numeric(values: Sequence[str]) -> list[float] | None:
    try:
        return [float(value) for value in values]
    except ValueError:
        return None


def _trade_off(summary: Summary) -> str:
    """A sweep over several objectives: its Pareto front drawn (two objectives: each configuration's means, the
    front joined; more: parallel coordinates, the front highlighted) and listed; nothing for one objective."""
    if not summary.trade_off:
        return ""
    figure = front_figure(summary)
    names = " and ".join(html.escape(name) for name, _ in summary.trade_off)
    listed = "".join(f"<li>{html.escape(row.configuration)} (n={row.n})</li>" for row in summary.front)
    drawn = _figure_html(figure, "pareto-front") if figure is not None else "<p>No configuration to draw.</p>"
    return (
        f"<h2>Trade-off: the Pareto front over {names}</h2>\n"
        f'<p class="note">Each configuration at its means over its finished runs (error bars: one standard '
        f"deviation); the front is every configuration that holds the constraints and that no other beats on every "
        f"objective. The chosen configuration is the best on {html.escape(summary.objective)} among them."
        f"</p>\n{drawn}\n<ul>{listed}</ul>"
    )


def front_figure(summary: Summary):
    """The front's figure (None without a configuration that has every objective): for two objectives a scatter of
    the configurations' means with error bars, the front joined and the infeasible ones apart; for more, parallel
    coordinates over the objectives, the front's lines coloured."""
    names = [name for name, _ in summary.trade_off]
    shown = [
        row
        for row in summary.configurations
        if row.complete and not row.pruned and all(row.mean(name) is not None for name in names)
    ]
    if not shown:
        return None
    front = {row.configuration for row in summary.front}
    if len(names) > 2:
        dimensions = [{"label": name, "values": [row.mean(name) for row in shown]} for name in names]
        colour = [1.0 if row.configuration in front else 0.0 for row in shown]
        figure = go.Figure(
            go.Parcoords(line={"color": colour, "colorscale": [[0, "#bbbbbb"], [1, "#d62728"]]}, dimensions=dimensions)
        )
        figure.update_layout(height=450, margin={"l": 80, "r": 80, "t": 60, "b": 40})
        return figure
    x, y = names
    figure = go.Figure()
    groups = (
        ("on the front", [row for row in shown if row.configuration in front], "#d62728"),
        ("behind it", [row for row in shown if row.configuration not in front and summary.feasible(row)], "#1f77b4"),
        ("infeasible", [row for row in shown if not summary.feasible(row)], "#bbbbbb"),
    )
    for label, rows, shade in groups:
        if not rows:
            continue
        ordered = sorted(rows, key=lambda row: row.mean(x) or 0.0)
        figure.add_trace(
            go.Scatter(
                x=[row.mean(x) for row in ordered],
                y=[row.mean(y) for row in ordered],
                error_x={"type": "data", "array": [row.std(x) or 0.0 for row in ordered]},
                error_y={"type": "data", "array": [row.std(y) or 0.0 for row in ordered]},
                mode="lines+markers" if label == "on the front" else "markers",
                name=label,
                marker={"color": shade, "size": 10},
                text=[row.configuration for row in ordered],
                hovertemplate="%{text}<br>" + f"{x} %{{x}}<br>{y} %{{y}}<extra></extra>",
            )
        )
    figure.update_layout(xaxis_title=x, yaxis_title=y, height=450, margin={"l": 80, "r": 40, "t": 40, "b": 60})
    return figure


def _parallel_coordinates(summary: Summary, log_keys: Collection[str] = ()) -> str:
    figure = parallel_figure(summary, log_keys)
    if figure is None:
        return "<h2>Swept values</h2>\n<p>No swept values with a finished run to draw.</p>"
    return (
        "<h2>Swept values against the objective</h2>\n"
        f'<p class="note">One line per configuration, at its mean {html.escape(summary.objective)} over its finished '
        "runs; drag along an axis to select a range. A value swept on a log scale (or spanning more than "
        f"{LOG_DECADES} decades) is drawn on a log axis.</p>\n" + _figure_html(figure, "parallel-coordinates")
    )


def parallel_figure(summary: Summary, log_keys: Collection[str] = ()):
    """The parallel coordinates: an axis per swept key (`log_keys` and widely spread positive values on a log
    axis, a categorical value's names), then the objective's; None where no finished configuration has a swept
    value."""

    shown = [
        (row, mean)
        for row in summary.configurations
        if not row.pruned and (mean := row.mean(summary.objective)) is not None and row.finished
    ]
    keys = [key for key in summary.swept_keys if any(key in row.finished[0].swept for row, _ in shown)]
    if not keys or not shown:
        return None
    dimensions = [
        _dimension(key, [row.finished[0].swept.get(key, "") for row, _ in shown], key in log_keys) for key in keys
    ]
    means = [mean for _, mean in shown]
    dimensions.append({"label": summary.objective, "values": means, "range": _padded(means)})
    figure = go.Figure(
        go.Parcoords(
            line={"color": means, "colorscale": "Viridis", "showscale": True},
            dimensions=dimensions,
        )
    )
    figure.update_layout(height=450, margin={"l": 80, "r": 80, "t": 60, "b": 40})
    return figure


def _dimension(key: str, values: Sequence[str], log: bool) -> dict[str, Any]:
    """One swept key's axis: numbers (on a log axis where `log` or spread over many decades), else categories."""
    numbers = _numeric(values)
    if numbers is None:
        categories = sorted(set(values))
        indexes = [float(categories.index(value)) for value in values]
        return {
            "label": key,
            "values": indexes,
            "range": _padded(indexes),
            "tickvals": list(range(len(categories))),
            "ticktext": categories,
        }
    if _log_axis(numbers, log):
        # Plotly's parallel coordinates have no log axis: the axis holds log10 of the values, labelled with them.
        logs = [math.log10(number) for number in numbers]
        ticks = _log_ticks(logs)
        return {
            "label": f"{key} (log)",
            "values": logs,
            "range": _padded(logs),
            "tickvals": ticks,
            "ticktext": [f"{10**tick:.3g}" for tick in ticks],
        }
    axis = {"label": key, "values": numbers, "range": _padded(numbers)}
    distinct = sorted(set(numbers))
    if len(distinct) <= _FEW_VALUES:  # a choice's values (batch 32 or 64): ticks at them alone, not 30.4 ... 65.6
        text = {number: value for number, value in zip(numbers, values, strict=True)}
        axis.update(tickvals=distinct, ticktext=[text[number] for number in distinct])
    return axis


def _log_axis(numbers: Sequence[float], log: bool) -> bool:
    """Positive values, swept on a log scale or spanning more than LOG_DECADES decades."""
    if not numbers or min(numbers) <= 0:
        return False
    return log or math.log10(max(numbers) / min(numbers)) > LOG_DECADES


def _log_ticks(logs: Sequence[float]) -> list[float]:
    """The whole decades between the lowest and highest value, and those two values themselves."""
    low, high = min(logs), max(logs)
    decades = [float(power) for power in range(math.ceil(low), math.floor(high) + 1)]
    return sorted({*decades, low, high})


# A numeric axis with at most this many values (a choice's, a grid's) is ticked at its values alone.
_FEW_VALUES = 8


def _padded(values: Sequence[float]) -> list[float]:
    """An axis range a little wider than the values: the lowest and highest lines run inside the frame."""
    low, high = min(values), max(values)
    pad = (high - low) * _PAD or max(abs(low) * _PAD, 0.5)
    return [low - pad, high + pad]


def _rgba(color: str, alpha: float) -> str:
    red, green, blue = (int(color[index : index + 2], 16) for index in (1, 3, 5))
    return f"rgba({red},{green},{blue},{alpha})"


def _job_label(job: JobRow) -> str:
    replicate = ", ".join(
        part for part in (f"seed {job.seed}" if job.seed else "", f"fold {job.fold}" if job.fold else "") if part
    )
    return f"job {job.job}" + (f" ({replicate})" if replicate else "") + f": {job.shown_status}"


def _curves(summary: Summary) -> str:
    parts = ["<h2>Curves</h2>"]
    drawn = summary.table.curve_keys("val")
    for metric in drawn:
        figure = curves_figure(summary, metric)
        if figure is not None:
            parts.append(_figure_html(figure, f"curves-{metric}"))
    if len(parts) == 1:
        parts.append(f"<p>No run logged {', '.join(drawn)} per epoch.</p>")
    else:
        parts.append(
            '<p class="note">Each configuration: its mean over the seeds and folds that trained every epoch (line) '
            "and their lowest to highest value (band); a pruned or failed run is its own dotted line, marked x.</p>"
        )
    return "\n".join(parts)


def curves_figure(summary: Summary, metric: str):
    """`metric` against the epoch: each configuration's mean and band, and its runs that did not finish, all in
    its colour; None where no run logged it."""

    figure = go.Figure()
    for index, row in enumerate(summary.configurations):
        color = _COLORS[index % len(_COLORS)]
        band = row.band(metric)
        if band:
            epochs, means, lows, highs = (list(values) for values in zip(*band, strict=True))
            figure.add_trace(
                go.Scatter(
                    x=epochs + epochs[::-1],
                    y=highs + lows[::-1],
                    fill="toself",
                    fillcolor=_rgba(color, 0.2),
                    line={"width": 0},
                    hoverinfo="skip",
                    legendgroup=str(index),
                    showlegend=False,
                )
            )
            figure.add_trace(
                go.Scatter(
                    x=epochs,
                    y=means,
                    mode="lines+markers",
                    line={"color": color},
                    marker={"color": color},  # else Plotly colours markers by the trace's place in its colour cycle
                    name=f"{row.configuration} (n={row.n})",
                    legendgroup=str(index),
                )
            )
        for job in row.jobs:
            points = job.curves.get(metric) or []
            if job.finished or not points:
                continue
            figure.add_trace(
                go.Scatter(
                    x=[step for step, _ in points],
                    y=[value for _, value in points],
                    mode="lines+markers",
                    line={"color": color, "dash": "dot", "width": 1},
                    marker={"symbol": "x", "color": color},
                    name=f"{row.configuration}, {_job_label(job)}",
                    legendgroup=str(index),
                )
            )
    if not figure.data:
        return None
    epochs = [x for trace in figure.data for x in trace.x]
    figure.update_layout(
        title=metric,
        xaxis={"title": "epoch", "tick0": 0, "dtick": _epoch_step(max(epochs)), "tickformat": "d"},
        yaxis_title=metric,
        height=420,
        legend={"font": {"size": 10}},
        margin={"t": 50},
    )
    return figure


def _epoch_step(last: int) -> int:
    """Whole epochs between ticks, 1, 2, 5, 10, 20, 50, ...: the smallest that gives `last` epochs ten ticks or
    fewer."""
    for power in itertools.count():
        for mantissa in (1, 2, 5):
            if last <= 10 * mantissa * 10**power:
                return mantissa * 10**power
    raise AssertionError("unreachable")


def _jobs_table(summary: Summary) -> str:
    rows = []
    for job in summary.rows:
        css = "pruned" if job.pruned else "" if job.ended else "failed"
        rows.append(
            f'<tr class="{css}"><td class="number">{job.job}</td><td>{html.escape(job.seed)}</td>'
            f"<td>{html.escape(job.fold)}</td><td>{html.escape(job.configuration)}</td>"
            f"<td>{html.escape(job.shown_status)}</td>"
            f'<td class="number">{_format(job.metrics.get(summary.objective))}</td>'
            f"<td><code>{html.escape(job.run_id)}</code></td><td>{html.escape(_shorten(job.error))}</td></tr>"
        )
    return (
        "<h2>Runs</h2>\n<table><thead><tr><th>job</th><th>seed</th><th>fold</th><th>configuration</th><th>status</th>"
        f"<th>{html.escape(summary.objective)}</th><th>MLflow run</th><th>error</th></tr></thead><tbody>\n"
        + "\n".join(rows)
        + "\n</tbody></table>"
    )


def _shorten(text: str, limit: int = 300) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _importances(study: StudyAddress | None) -> str:
    """An Optuna sweep's parameter importances (fANOVA, seeded), or a sentence saying why there are none."""
    if study is None:
        return ""
    heading = "<h2>Parameter importances (Optuna)</h2>\n"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = open_storage(study.storage)
        # study_name=None: the storage's only study (Optuna refuses a storage of several).
        loaded = optuna.load_study(study_name=study.name or None, storage=storage)
    except (RunnerError, KeyError, ValueError) as error:
        said = f"The study {study.name!r} in {study.storage} could not be opened ({error})."
        return heading + f"<p>{html.escape(said[:500])}</p>"
    completed = loaded.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(completed) < 2:
        return heading + f"<p>Not drawn: {len(completed)} completed trial(s); importances need at least 2.</p>"
    try:
        figure = optuna.visualization.plot_param_importances(loaded, evaluator=FanovaImportanceEvaluator(seed=0))
    except (ValueError, RuntimeError) as error:
        return heading + f"<p>Not drawn: {html.escape(str(error)[:300])}</p>"
    return (
        heading + '<p class="note">How much of the objective\'s variation across the completed trials each parameter '
        "explains (fANOVA over a random forest, seeded).</p>\n" + _figure_html(figure, "param-importances")
    )

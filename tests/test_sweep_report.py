"""The sweep report (sweep_report.html) and `python -m runner.report`, over sweeps written straight to a real MLflow
store (no training): what it says about configurations that are the same and one that is much worse, with intervals
and tests of one method that agree, a sweep whose every job failed, its charts' axes and colours, that
`python -m runner.report` finds the sweep's store from any directory, that it draws its charts in a real browser
with no error, and that the histories are read in bulk through a tracking server."""

from __future__ import annotations

import csv
import html
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import pytest
from mlflow.tracking import MlflowClient
from scipy import stats

from helpers.browser import Chromium
from helpers.requires import requires
from helpers.servers import MlflowServer, answers
from helpers.simulated_sweeps import simulate_sweep, sweep_config
from helpers.sweeps import without_generated_line
from helpers.waiting import wait_for
from runner.errors import RunnerError
from runner.report import main as report_main
from runner.sweeps.report import summary as sweep_summary
from runner.sweeps.report.histories import UI_BULK_ENDPOINT, _BulkReader
from runner.sweeps.report.report import REPORT_FILE, curves_figure, log_scaled_keys, parallel_figure
from runner.sweeps.report.summary import CSV_FILE, CURVE_METRICS, MARKDOWN_FILE, REPORT_CURVE_METRICS
from runner.sweeps.terms import PARENT_RUN_ID_FILE, SCORES_TAG, TASK_OBJECTIVE_TAG, TRACKING_URI_FILE
from runner.sweeps.uncertainty import confidence_interval

# Two configurations with the same values (different job numbers), one much worse, one with a failed fold, one
# pruned after its first epoch, and one whose three values all lie below the best's lowest (the case: a
# bootstrap over three values, their range, looked clearly apart while the test found no difference).
CONFIGURATIONS = {
    "0.1": [0.81, 0.84, 0.79],
    "0.2": [0.81, 0.84, 0.79],
    "1e-09": [0.31, 0.35, 0.28],
    "0.5": [0.6, None, 0.62],
    "0.7": [0.5, 0.5, 0.5],
    "0.05": [0.78, 0.76, 0.70],
}
CORRECTED_T = "corrected resampled t (Nadeau & Bengio 2003), n=3, 3 folds"
CORRECTED_TEST = "corrected paired t-test (Nadeau & Bengio 2003)"


def corrected_interval(values: list[float], folds: int = 3) -> tuple[float, float]:
    """Nadeau and Bengio's interval of the mean of J runs of a K-fold sweep, mean ± t(0.975, J-1)·√((1/J + 1/(K-1))·s²),
    clipped to an accuracy's [0, 1]."""
    j, mean = len(values), statistics.fmean(values)
    half = stats.t.ppf(0.975, j - 1) * math.sqrt((1 / j + 1 / (folds - 1)) * statistics.variance(values))
    return max(0.0, mean - half), min(1.0, mean + half)


def corrected_p(best: str, other: str, folds: int = 3) -> float:
    """Nadeau and Bengio's paired test of two configurations' folds: t = mean(d)/√((1/J + 1/(K-1))·var(d))."""
    d = [o - b for o, b in zip(CONFIGURATIONS[other], CONFIGURATIONS[best], strict=True)]
    t = statistics.fmean(d) / math.sqrt((1 / len(d) + 1 / (folds - 1)) * statistics.variance(d))
    return float(2 * stats.t.sf(abs(t), len(d) - 1))


def shown(interval: tuple[float, float]) -> str:
    return f"[{interval[0]:.4f}, {interval[1]:.4f}]"


PRUNED = {("0.7", fold): 1 for fold in range(3)}


def report_rows(page: str) -> dict[str, str]:
    """The configurations table's rows, by configuration, as text."""
    table = page.split("<h2>Configurations</h2>")[1].split("</table>")[0]
    rows = {}
    for row in re.findall(r"<tr class=\"[a-z]*\">(.*?)</tr>", table):
        cells = [html.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        rows[cells[0]] = " | ".join(cells)
    return rows


@pytest.fixture
def simulated(tmp_path):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    parent_id = simulate_sweep(MlflowClient(store), str(tmp_path / "sweep"), CONFIGURATIONS, pruned=PRUNED)
    return store, parent_id


def test_the_report_calls_identical_configurations_indistinguishable_and_a_much_worse_one_worse(
    simulated, tmp_path, capsys
):
    store, parent_id = simulated
    out = tmp_path / "out"
    assert report_main([parent_id, "--tracking-uri", store, "--out", str(out)]) == 0
    page = (out / REPORT_FILE).read_text()
    rows = report_rows(page)
    assert "the best" in rows["optimizer.lr=0.1"] and "0.8133" in rows["optimizer.lr=0.1"]
    best_interval = corrected_interval(CONFIGURATIONS["0.1"])
    assert shown(best_interval) in rows["optimizer.lr=0.1"]  # three folds: the corrected t
    assert CORRECTED_T in rows["optimizer.lr=0.1"]
    assert "indistinguishable from the best (p=1, Holm, 3 matched runs)" in rows["optimizer.lr=0.2"]
    assert re.search(r"worse than the best \(p=0\.0\d+, Holm, 3 matched runs\)", rows["optimizer.lr=1e-09"])
    assert "not compared (a run did not finish)" in rows["optimizer.lr=0.5"] and "FAILED" in rows["optimizer.lr=0.5"]
    assert "pruned: not compared" in rows["optimizer.lr=0.7"] and "pruned at epoch 1" in rows["optimizer.lr=0.7"]
    assert not re.search(r"<script[^>]*\bsrc=", page)  # opens offline: plotly.js is inline, nothing is fetched
    for div in ("parallel-coordinates", *(f"curves-{metric}" for metric in REPORT_CURVE_METRICS)):
        assert f'id="{div}"' in page, div
    assert "job 4 (seed 42, fold 0): pruned at epoch 1" in page and "job 3 (seed 42, fold 1): FAILED" in page

    # The intervals and the tests use the same method, so they agree: an interval apart from the best's is a
    # configuration the test calls worse, and one the test cannot tell apart overlaps the best's.
    close = corrected_interval(CONFIGURATIONS["0.05"])
    assert close[0] < best_interval[0] < close[1] and shown(close) in rows["optimizer.lr=0.05"]
    verdict = re.search(
        r"indistinguishable from the best \(p=([\d.]+), Holm, 3 matched runs\), " + re.escape(CORRECTED_TEST),
        rows["optimizer.lr=0.05"],
    )
    # Holm: the second smallest of the three p-values, times two.
    assert verdict and float(verdict[1]) == pytest.approx(2 * corrected_p("0.1", "0.05"), abs=1e-3)
    far = corrected_interval(CONFIGURATIONS["1e-09"])
    assert far[1] < best_interval[0] and shown(far) in rows["optimizer.lr=1e-09"]
    assert CORRECTED_TEST in rows["optimizer.lr=1e-09"]
    assert "Inference for the Generalization Error" in page and "Bouckaert &amp; Frank, PAKDD 2004" in page

    # The CSV summary beside it gains the objective's interval and the comparison.
    with open(out / CSV_FILE) as handle:
        summary = {row["configuration"]: row for row in csv.DictReader(handle)}
    assert float(summary["optimizer.lr=0.1"]["val_accuracy_ci95_low"]) == pytest.approx(best_interval[0], abs=1e-4)
    assert float(summary["optimizer.lr=0.1"]["val_accuracy_ci95_high"]) == pytest.approx(best_interval[1], abs=1e-4)
    assert summary["optimizer.lr=0.1"]["val_accuracy_ci95_method"] == CORRECTED_T
    assert summary["optimizer.lr=0.2"]["compared_with_best"].endswith(CORRECTED_TEST)
    markdown = (out / MARKDOWN_FILE).read_text()
    assert (
        f"{shown(best_interval)} ({CORRECTED_T})" in markdown and "Inference for the Generalization Error" in markdown
    )
    assert summary["optimizer.lr=0.2"]["compared_with_best"].startswith("indistinguishable from the best")
    assert summary["optimizer.lr=1e-09"]["compared_with_best"].startswith("worse than the best")

    # Rebuilt, it is the same page but for its Generated line.
    again = tmp_path / "again"
    assert report_main([parent_id, "--tracking-uri", store, "--out", str(again)]) == 0
    assert without_generated_line((again / REPORT_FILE).read_text()) == without_generated_line(page)

    # Bad input: one paragraph each, exit 2.
    capsys.readouterr()
    empty = tmp_path / "not-a-sweep"
    empty.mkdir()
    assert report_main([str(empty), "--tracking-uri", store]) == 2
    assert "is a directory without mlflow_parent_run_id.txt" in capsys.readouterr().err
    assert report_main(["0123456789abcdef", "--tracking-uri", store]) == 2
    said = capsys.readouterr().err
    assert said.startswith("error: '0123456789abcdef' is not valid:") and "has no run" in said and "Fix:" in said
    assert report_main([parent_id, "--tracking-uri", f"sqlite:///{tmp_path}/nowhere.db"]) == 2
    assert "there is no MLflow store at" in capsys.readouterr().err
    assert not (tmp_path / "nowhere.db").exists()
    assert report_main([str(tmp_path / "no" / "such" / "dir"), "--tracking-uri", store]) == 2
    said = capsys.readouterr().err
    assert f"'{tmp_path}/no/such/dir' is not valid: it is a directory that does not exist" in said, said
    assert "Fix: pass the sweep directory" in said and "has no run" not in said and said.count("\n") == 1


@pytest.mark.server
@requires("chromium")
def test_the_report_draws_its_charts_in_chromium_with_no_console_error(simulated, tmp_path):
    store, parent_id = simulated
    assert report_main([parent_id, "--tracking-uri", store, "--out", str(tmp_path)]) == 0
    browser = Chromium(user_data_dir=tmp_path / "chromium-profile", log=tmp_path / "chromium.log")
    try:
        browser.open("about:blank")
        browser.send("Page.enable")
        browser.send(
            "Page.addScriptToEvaluateOnNewDocument",
            {
                "source": "window.reportErrors = [];"
                " addEventListener('error', e => reportErrors.push(String(e.message)));"
                " const original = console.error; console.error = (...a) => { reportErrors.push(a.join(' '));"
                " original(...a); };"
            },
        )
        browser.send("Page.navigate", {"url": (tmp_path / REPORT_FILE).as_uri()})
        plots = browser.wait_for(
            "document.readyState === 'complete' && document.querySelectorAll('.js-plotly-plot .main-svg').length >= 4"
            " && document.querySelectorAll('.js-plotly-plot').length"
        )
        assert plots == 1 + len(REPORT_CURVE_METRICS)  # parallel coordinates and the curves
        assert browser.evaluate("document.querySelectorAll('#curves-val_accuracy .scatterlayer .trace').length") > 0
        assert browser.evaluate("window.reportErrors") == []
        assert "indistinguishable from the best" in browser.text()
    finally:
        browser.close()


def _requests_by_path(log: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in re.findall(r'"(?:GET|POST) (/[^ ?"]*)', log):
        counts[path] = counts.get(path, 0) + 1
    return counts


@pytest.mark.slow  # an MLflow server and python -m runner.report, a process each
@pytest.mark.server
@pytest.mark.alone  # the report must take under 60 s
def test_the_summary_and_report_of_500_runs_of_20_epochs_read_through_a_server_in_few_requests(tmp_path):
    """The histories come in bulk: requests grow with the runs (per 100) and the metrics drawn, never with
    runs x metrics x epochs (500 x 5 x 20 = 50,000 points)."""
    # In memory where there is /dev/shm: sqlite's commit per write (an fsync) is most of the time writing takes.
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else tmp_path) as memory:
        _report_500_runs(tmp_path, f"sqlite:///{memory}/mlflow.db")


def _report_500_runs(tmp_path, store: str) -> None:
    started = time.monotonic()
    configurations = {f"{index / 1000:g}": [0.5 + index / 1000] * 5 for index in range(100)}  # 100 x 5 folds
    parent_id = simulate_sweep(MlflowClient(store), str(tmp_path / "sweep"), configurations, epochs=20)
    written = time.monotonic() - started
    server = MlflowServer(store, tmp_path / "artifacts", tmp_path / "server.log").start()
    try:
        before = _requests_by_path((tmp_path / "server.log").read_text())
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "runner.report", parent_id, "--tracking-uri", server.url, "--out", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr[-3000:]
        # The access log's last lines: the report's requests are all logged once a request made after them is.
        marker = "/health?after-the-report"
        assert answers(server.url + marker)

        def logged_after_the_report() -> str | None:
            text = (tmp_path / "server.log").read_text()
            return text if marker in text else None

        log = wait_for(logged_after_the_report, 30, "the access log line of a request made after the report's")
        after = _requests_by_path("\n".join(line for line in log.splitlines() if marker not in line))
        # A server without the UI's bulk endpoint is read through the REST API's (sampled, slower): the same points.
        some = [
            row["run_id"] for row in csv.DictReader((tmp_path / sweep_summary.JOBS_CSV_FILE).read_text().splitlines())
        ][:10]
        ui = _BulkReader(server.url)
        rest = _BulkReader(server.url)
        rest.ui_endpoint = False
        assert sorted(ui.read(some, "val_loss")) == sorted(rest.read(some, "val_loss"))
        assert len(ui.read(some, "val_loss")) == 10 * 20
    finally:
        server.stop()
    requests = {path: after.get(path, 0) - before.get(path, 0) for path in after}
    requests = {path: count for path, count in requests.items() if count}
    metrics = len(dict.fromkeys(CURVE_METRICS + REPORT_CURVE_METRICS))
    assert requests.get(UI_BULK_ENDPOINT) == metrics * 5, requests  # 500 runs, 100 a request
    assert "/api/2.0/mlflow/metrics/get-history" not in requests  # never one run's one metric
    assert sum(requests.values()) <= metrics * 5 + 10, requests  # + the parent and a page of children
    assert took < 60, f"{took:.1f} s (writing the runs took {written:.1f} s)"
    rows = report_rows((tmp_path / REPORT_FILE).read_text())
    assert len(rows) == 100 and all(" | 5 of 5 | " in row for row in rows.values())
    assert sweep_summary.CURVES_FILE in done.stdout


def test_an_optuna_studys_importances_are_drawn_from_two_completed_trials_and_otherwise_explained(tmp_path):
    """A sweep directory without multirun.yaml (copied from elsewhere) still has its journal: the storage's only
    study is the sweep's, whatever its name."""
    import optuna

    from runner.sweeps.report.report import _importances, find_study
    from runner.sweeps.study.study import open_storage
    from runner.sweeps.terms import JOURNAL_FILE

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="fashion_mnist", storage=open_storage(str(tmp_path / JOURNAL_FILE)))
    study.optimize(lambda trial: trial.suggest_float("lr", 0.001, 0.1) + trial.suggest_int("batch", 1, 4) * 0, 1)
    source = find_study(str(tmp_path), {"hparams_search": "optuna"})
    assert source is not None and source.storage == str(tmp_path / JOURNAL_FILE) and source.name == ""
    assert "Not drawn: 1 completed trial(s); importances need at least 2." in _importances(source)
    study.optimize(lambda trial: trial.suggest_float("lr", 0.001, 0.1) + trial.suggest_int("batch", 1, 4) * 0, 4)
    drawn = _importances(source)
    assert 'id="param-importances"' in drawn and drawn == _importances(source)  # seeded: the same every time
    assert find_study(str(tmp_path / "elsewhere"), {"batch": "32,64"}) is None  # no study: not an Optuna sweep


def test_a_sweep_directory_names_its_store_so_the_report_reads_it_from_any_directory(tmp_path, monkeypatch, capsys):
    """A relative sqlite store (the default's mlflow.db, or mlflow.tracking_uri=sqlite:///mlflow.db) is relative to
    where the sweep started: the sweep records it absolute, and python -m runner.report reads that from elsewhere."""
    from omegaconf import OmegaConf

    from runner.sweeps.plugins.parent_run import start_parent_run
    from runner.sweeps.sweep_config import SweepConfig

    started = tmp_path / "project"
    started.mkdir()
    monkeypatch.chdir(started)
    sweep_dir = started / "multirun" / "sweep"
    config = sweep_config(str(sweep_dir), "sqlite:///mlflow.db", "optimizer.lr=0.1,0.2")
    parent_id = start_parent_run(config, SweepConfig.read(config))
    assert (sweep_dir / TRACKING_URI_FILE).read_text() == f"sqlite:///{started}/mlflow.db\n"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert report_main([str(sweep_dir), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert parent_id in (tmp_path / "out" / REPORT_FILE).read_text() and not (elsewhere / "mlflow.db").exists()

    # A sweep directory from before it recorded its store: its multirun.yaml's relative store, from where it started.
    (sweep_dir / TRACKING_URI_FILE).unlink()
    OmegaConf.update(config, "hydra.runtime.cwd", str(started), force_add=True)
    OmegaConf.save(config, sweep_dir / "multirun.yaml")
    assert report_main([str(sweep_dir), "--out", str(tmp_path / "again")]) == 0, capsys.readouterr().err

    # The store gone: the refusal names the sweep's store, and no --tracking-uri that was not passed.
    (started / "mlflow.db").rename(started / "moved.db")
    assert report_main([str(sweep_dir)]) == 2
    said = capsys.readouterr().err
    assert said.startswith(f"error: the sweep's store 'sqlite:///{started}/mlflow.db' (mlflow.tracking_uri in its ")
    assert f"there is no MLflow store at {started}/mlflow.db. Fix: pass the sweep's store with" in said
    assert "--tracking-uri=" not in said and said.count("\n") == 1


def test_a_sweep_whose_every_job_failed_says_so_and_keeps_its_objective(tmp_path, monkeypatch):
    """Not `The others finished`, and chosen_by stays the objective asked for (no finished run tells whether the
    data could be split, so there is no reason to fall back on the test set)."""
    from runner.sweeps.plugins.parent_run import finish_parent_run
    from runner.sweeps.sweep_config import SweepConfig

    monkeypatch.chdir(tmp_path)  # the simulated experiment's artifacts
    store = f"sqlite:///{tmp_path}/mlflow.db"
    sweep_dir = tmp_path / "sweep"
    client = MlflowClient(store)
    parent_id = simulate_sweep(client, str(sweep_dir), {"0.1": [None, None], "0.2": [None]})
    sweep_dir.mkdir()
    (sweep_dir / PARENT_RUN_ID_FILE).write_text(parent_id + "\n")
    with pytest.raises(RunnerError) as raised:
        config = sweep_config(str(sweep_dir), store, "optimizer.lr=0.1,0.2")
        finish_parent_run(config, SweepConfig.read(config))
    said = str(raised.value)
    assert said.startswith("3 of 3 sweep jobs failed: job 0 (optimizer.lr=0.1,fold=0)") and "The others" not in said
    assert f"None finished, so the summary above and MLflow parent run {parent_id} have no best configuration" in said
    assert client.get_run(parent_id).data.tags["chosen_by"] == "val_accuracy"
    every = "Every job failed (3 of 3): no configuration has a val_accuracy, so none is the best and none is compared"
    assert every in (sweep_dir / MARKDOWN_FILE).read_text()
    page = (sweep_dir / REPORT_FILE).read_text()
    assert every in page and "chose the winner" not in page


def test_a_choice_of_numbers_is_ticked_at_its_values_and_a_spread_of_many_is_a_continuous_axis():
    from runner.sweeps.report.report import _dimension

    batch = _dimension("batch", ["64", "32", "64"], False)
    assert (batch["tickvals"], batch["ticktext"]) == ([32.0, 64.0], ["32", "64"])  # not 30.4, 35, ..., 65.6
    assert batch["range"][0] < 32 < 64 < batch["range"][1]  # the lines run inside the frame
    spread = _dimension("optimizer.lr", [str(0.001 * step) for step in range(1, 12)], False)
    assert "tickvals" not in spread and len(spread["values"]) == 11


def test_a_regression_sweeps_winner_shows_its_test_value_of_every_metric_everywhere(tmp_path, monkeypatch, capsys):
    """Two configurations of a regression, two runs each: the winner's test_mae, test_rmse and test_loss, each the
    mean of its runs' values with its interval, in the terminal, sweep_summary.md, the parent run and the report."""
    from runner.sweeps.plugins.parent_run import finish_parent_run
    from runner.sweeps.sweep_config import SweepConfig

    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path}/mlflow.db"
    sweep_dir = tmp_path / "sweep"
    client = MlflowClient(store)
    errors = {"0.1": [0.30, 0.34], "0.2": [0.20, 0.24]}
    tests = {"test_mae": 0.01, "test_rmse": 0.1, "test_loss": 0.05}
    parent_id = simulate_sweep(client, str(sweep_dir), errors, objective="val_mae", tests=tests)
    sweep_dir.mkdir()
    (sweep_dir / PARENT_RUN_ID_FILE).write_text(parent_id + "\n")
    composed_with = ["task=regression", "mlflow.log_model=false"]
    config = sweep_config(str(sweep_dir), store, "optimizer.lr=0.1,0.2", composed_with=composed_with)
    finish_parent_run(config, SweepConfig.read(config))

    said = capsys.readouterr().out
    [line] = [line for line in said.splitlines() if line.startswith("the winner's test metrics")]
    values = [0.20, 0.24]  # the winner's (optimizer.lr=0.2, the lower val_mae) runs' final objectives
    parent = client.get_run(parent_id).data.metrics
    for key, offset in tests.items():
        runs = [value + offset for value in values]
        interval = confidence_interval(runs, 2, key)
        assert interval.bounds is not None
        shown = f"{key} {statistics.fmean(runs):.4f} ± {statistics.stdev(runs):.4f} [{interval.bounds[0]:.4f}, "
        assert shown in line, line
        assert parent[f"best_{key}_mean"] == pytest.approx(statistics.fmean(runs))
        assert parent[f"best_{key}_std"] == pytest.approx(statistics.stdev(runs))
    assert line.index("test_mae") < line.index("test_rmse") < line.index("test_loss")
    assert line in (sweep_dir / MARKDOWN_FILE).read_text()
    page = (sweep_dir / REPORT_FILE).read_text()
    assert "<h2>The winner's test metrics</h2>" in page and "optimizer.lr=0.2</b>, over its 2 finished run(s)" in page
    for key, offset in tests.items():
        assert f'<td>{key}</td><td class="number">{statistics.fmean(v + offset for v in values):.4f}</td>' in page


def test_the_reports_charts_have_log_axes_room_at_the_frame_whole_epochs_and_one_colour_per_configuration(simulated):
    store, parent_id = simulated
    summary = sweep_summary.collect(MlflowClient(store), parent_id, "val_accuracy", False)

    # optimizer.lr spans 1e-09 to 0.5: a log axis, its ticks labelled with the values; every axis padded.
    [lr, objective] = parallel_figure(summary).data[0].dimensions
    values = [
        float(row.finished[0].swept["optimizer.lr"]) for row in summary.configurations if row.n and not row.pruned
    ]
    assert lr.label == "optimizer.lr (log)" and list(lr.values) == pytest.approx([math.log10(v) for v in values])
    assert "1e-09" in lr.ticktext and "0.5" in lr.ticktext and "0.1" in lr.ticktext
    for dimension in (lr, objective):
        assert dimension.range[0] < min(dimension.values) and max(dimension.values) < dimension.range[1]
    # Two decades or fewer: a linear axis unless the sweep drew the key on a log scale (tag(log, ...)).
    narrow = [row for row in summary.configurations if row.configuration in ("optimizer.lr=0.1", "optimizer.lr=0.5")]
    narrowed = sweep_summary.Summary(**{**summary.__dict__, "configurations": narrow})
    assert parallel_figure(narrowed).data[0].dimensions[0].label == "optimizer.lr"
    log_keys = log_scaled_keys(None, "batch=32,64 optimizer.lr=tag(log, interval(1e-5, 1e-1))")
    assert log_keys == {"optimizer.lr"}
    assert parallel_figure(narrowed, log_keys).data[0].dimensions[0].label == "optimizer.lr (log)"
    config = sweep_config("sweep", store, "batch=32,64")
    config.hydra.sweeper.params = {"optimizer.lr": "tag(log, interval(0.0001, 0.01))", "batch": "choice(32, 64)"}
    assert log_scaled_keys(config) == {"optimizer.lr"}

    # The curves: whole epochs on the x axis, and each configuration's markers in its line's colour.
    figure = curves_figure(summary, "val_accuracy")
    assert (figure.layout.xaxis.dtick, figure.layout.xaxis.tickformat) == (1, "d")
    marked = [trace for trace in figure.data if "markers" in (trace.mode or "")]
    assert marked and all(trace.marker.color == trace.line.color for trace in marked)
    assert len({trace.line.color for trace in marked}) == len([row for row in summary.configurations if row.jobs])


@pytest.mark.parametrize("epochs", [1, 3, 30])
def test_the_curves_pngs_tick_whole_epochs(epochs):
    """The sweep's sweep_curves.png and a run's curves.png: a lone epoch is not drawn between 0.96 and 1.04."""
    from runner.plots import curves_figure as run_curves_figure
    from runner.plots import sweep_curves_figure

    points = [(epoch, 0.5 + epoch / 100) for epoch in range(1, epochs + 1)]
    band = [(epoch, value, value - 0.01, value + 0.01) for epoch, value in points]
    for figure in (
        run_curves_figure({"train_loss": points, "test_accuracy": points}),
        sweep_curves_figure({"lr=0.1 (n=3)": {"test_accuracy": band, "test_loss": band}}),
    ):
        figure.canvas.draw()
        for axis in figure.axes:
            ticks = axis.get_xticks()
            assert len(ticks) and all(float(tick).is_integer() for tick in ticks), ticks


def test_one_run_per_configuration_has_no_interval_and_no_test_and_says_so(tmp_path):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    parent_id = simulate_sweep(MlflowClient(store), str(tmp_path / "sweep"), {"0.1": [0.8], "0.2": [0.7]})
    assert report_main([parent_id, "--tracking-uri", store, "--out", str(tmp_path)]) == 0
    rows = report_rows((tmp_path / REPORT_FILE).read_text())
    assert "| n = 1: no interval |  | the best |" in rows["optimizer.lr=0.1"]
    assert "| n = 1: no interval |  | not enough matched runs to test (1 matched) |" in rows["optimizer.lr=0.2"]
    markdown = (tmp_path / MARKDOWN_FILE).read_text()
    assert "| n = 1: no interval | not enough matched runs to test (1 matched) |" in markdown


def test_a_sweep_on_a_metric_of_its_own_chooses_by_its_direction_and_shows_it_in_every_output(tmp_path):
    """The sweep's metric table (its `metrics`): a lower-better `val_mae` chooses the lowest configuration, and the
    summaries' columns, the report's curves and the picture follow the sweep's scores instead of accuracy."""
    from runner.metric_table import Metric, MetricTable
    from runner.sweeps.report.outputs import SweepFacts, write_outputs

    store = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(store)
    errors = {"0.1": [0.30, 0.32], "0.2": [0.20, 0.22], "0.3": [0.50, 0.52]}
    parent_id = simulate_sweep(client, str(tmp_path / "sweep"), errors, objective="val_mae")
    table = MetricTable.of([Metric.of("mae")])
    facts = SweepFacts("val_mae", None, table, None, True, None, frozenset())
    summary, paths = write_outputs(client, parent_id, facts, str(tmp_path / "sweep"), str(tmp_path))
    assert summary.best_configuration is not None and summary.best_configuration.configuration == "optimizer.lr=0.2"
    assert summary.best is not None and summary.best.metrics["val_mae"] == pytest.approx(0.20)
    with open(tmp_path / CSV_FILE) as handle:
        columns = next(csv.reader(handle))
    assert "val_mae_mean" in columns and "eval_mae_mean" in columns and "val_accuracy_mean" not in columns
    page = (tmp_path / REPORT_FILE).read_text()
    assert 'id="curves-val_mae"' in page and 'id="curves-val_accuracy"' not in page
    assert "lower is better" in page
    assert {os.path.basename(path) for path in paths} >= {CSV_FILE, MARKDOWN_FILE, REPORT_FILE, "sweep_curves.png"}

    # By its parent run id where its directory is not: a task=regression sweep's start records its scores and the
    # task's score on the parent run (here the resumed parent, as a re-run's start does), and the report reads them.
    from runner.sweeps.plugins.parent_run import start_parent_run
    from runner.sweeps.sweep_config import SweepConfig

    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / PARENT_RUN_ID_FILE).write_text(parent_id + "\n")
    config = sweep_config(
        str(sweep_dir), store, "task=regression", "optimizer.lr=0.1,0.2,0.3", composed_with=["task=regression"]
    )
    assert start_parent_run(config, SweepConfig.read(config)) == parent_id
    tags = client.get_run(parent_id).data.tags
    assert (tags[SCORES_TAG], tags[TASK_OBJECTIVE_TAG]) == ("mae:minimize,rmse:minimize", "mae")
    shutil.rmtree(sweep_dir)
    assert report_main([parent_id, "--tracking-uri", store, "--out", str(tmp_path / "by_id")]) == 0
    with open(tmp_path / "by_id" / CSV_FILE) as handle:
        columns = next(csv.reader(handle))
    assert {"val_mae_mean", "val_rmse_mean", "eval_mae_mean"} <= set(columns), columns
    assert not [column for column in columns if "accuracy" in column], columns
    page = (tmp_path / "by_id" / REPORT_FILE).read_text()
    assert 'id="curves-val_mae"' in page and "lower is better" in page

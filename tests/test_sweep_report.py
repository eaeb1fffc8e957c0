"""The sweep report (sweep_report.html) and `python -m runner.report`, over sweeps written straight to a real MLflow
store (no training): what it says about configurations that are the same and one that is much worse, that it draws
its charts in a real browser with no error, and that the histories are read in bulk through a tracking server."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import tempfile
import time

import pytest
from mlflow.tracking import MlflowClient

from helpers.browser import Chromium
from helpers.requires import requires
from helpers.servers import MlflowServer
from helpers.simulated_sweeps import simulate_sweep
from helpers.sweeps import without_generated_line
from runner.report import main as report_main
from runner.sweeps import summary as sweep_summary
from runner.sweeps.histories import UI_BULK_ENDPOINT, _BulkReader
from runner.sweeps.report import REPORT_FILE
from runner.sweeps.summary import CSV_FILE, CURVE_METRICS, REPORT_CURVE_METRICS

# Two configurations with the same values (different job numbers), one much worse, one with a failed fold, one
# pruned after its first epoch.
CONFIGURATIONS = {
    "0.1": [0.81, 0.84, 0.79],
    "0.2": [0.81, 0.84, 0.79],
    "1e-09": [0.31, 0.35, 0.28],
    "0.5": [0.6, None, 0.62],
    "0.7": [0.5, 0.5, 0.5],
}
PRUNED = {("0.7", fold): 1 for fold in range(3)}


def report_rows(page: str) -> dict[str, str]:
    """The configurations table's rows, by configuration, as text."""
    table = page.split("<h2>Configurations</h2>")[1].split("</table>")[0]
    rows = {}
    for row in re.findall(r"<tr class=\"[a-z]*\">(.*?)</tr>", table):
        cells = [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
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
    assert "[0.7900, 0.8400]" in rows["optimizer.lr=0.1"]  # three folds: the interval spans them
    assert "indistinguishable from the best (p=1, Holm, 3 matched runs)" in rows["optimizer.lr=0.2"]
    assert re.search(r"worse than the best \(p=0\.0\d+, Holm, 3 matched runs\)", rows["optimizer.lr=1e-09"])
    assert "not compared (a run did not finish)" in rows["optimizer.lr=0.5"] and "FAILED" in rows["optimizer.lr=0.5"]
    assert "pruned: not compared" in rows["optimizer.lr=0.7"] and "pruned at epoch 1" in rows["optimizer.lr=0.7"]
    assert not re.search(r"<script[^>]*\bsrc=", page)  # opens offline: plotly.js is inline, nothing is fetched
    for div in ("parallel-coordinates", *(f"curves-{metric}" for metric in REPORT_CURVE_METRICS)):
        assert f'id="{div}"' in page, div
    assert "job 4 (seed 42, fold 0): pruned at epoch 1" in page and "job 3 (seed 42, fold 1): FAILED" in page

    # The CSV summary beside it gains the objective's interval and the comparison.
    with open(out / CSV_FILE) as handle:
        summary = {row["configuration"]: row for row in csv.DictReader(handle)}
    assert float(summary["optimizer.lr=0.1"]["val_accuracy_ci95_low"]) == 0.79
    assert float(summary["optimizer.lr=0.1"]["val_accuracy_ci95_high"]) == 0.84
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
        time.sleep(0.5)  # the access log's last lines
        after = _requests_by_path((tmp_path / "server.log").read_text())
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

    from runner.sweeps.report import _importances, find_study
    from runner.sweeps.study import JOURNAL_FILE, open_storage

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

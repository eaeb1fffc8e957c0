"""The runner's speed features and the benchmark's bookkeeping, by behaviour (speed itself is in
docs/performance.md)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from runner import heap
from runner.training.progress import FIRST_STEP_MESSAGE, EpochProgress, seconds_since_process_start

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_first_completed_step_is_logged_once_with_or_without_the_bar(caplog, enabled):
    progress = EpochProgress(epochs=2, enabled=enabled)
    with caplog.at_level(logging.INFO, logger="runner"):
        for epoch in (1, 2):
            progress.start_epoch(epoch, 3)
            for _ in range(3):
                progress.advance(1, 0.5)
    lines = [record.getMessage() for record in caplog.records if FIRST_STEP_MESSAGE in record.getMessage()]
    assert len(lines) == 1
    assert "s after the process started" in lines[0]


def test_the_first_step_line_is_a_line_of_its_own_below_the_bar(capsys):
    """Logged while the epoch's bar is on the terminal, the line once ran on from the bar ("...?step/s][date]
    [runner][INFO] - first training step done")."""
    console = logging.StreamHandler(sys.stderr)  # Hydra's console handler, on the terminal the bar draws on
    console.setFormatter(logging.Formatter("[runner] %(message)s"))
    root, runner_log = logging.getLogger(), logging.getLogger("runner")
    level = runner_log.level
    root.addHandler(console)
    runner_log.setLevel(logging.INFO)
    try:
        progress = EpochProgress(epochs=1, enabled=True)
        progress.start_epoch(1, 3)
        progress.advance(1, 0.5)
    finally:
        root.removeHandler(console)
        runner_log.setLevel(level)
    # The bar redraws with carriage returns: each redraw is a line here, as on a terminal.
    [line] = [line for line in capsys.readouterr().err.splitlines() if FIRST_STEP_MESSAGE in line]
    assert line.startswith(f"[runner] {FIRST_STEP_MESSAGE}"), line


def test_a_first_call_of_several_steps_says_how_many(caplog):
    with caplog.at_level(logging.INFO, logger="runner"):
        EpochProgress(epochs=1, enabled=False).advance(20, 0.5)
    [line] = [record.getMessage() for record in caplog.records]
    assert line.startswith(f"{FIRST_STEP_MESSAGE} (20 steps in the first call)")


def test_seconds_since_process_start_counts_from_this_process():
    age = seconds_since_process_start()
    assert age is not None and 0 < age < 24 * 3600
    child = subprocess.run(
        [sys.executable, "-c", "from runner.training.progress import seconds_since_process_start as s; print(s())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert 0 <= float(child.stdout) < age  # a fresh process is younger than this test session


def test_the_heap_is_padded_by_default_and_the_setting_can_turn_it_off(monkeypatch):
    monkeypatch.delenv("MALLOC_TOP_PAD_", raising=False)
    monkeypatch.delenv(heap.ENV_VAR, raising=False)
    assert heap.keep_freed_memory() == heap.DEFAULT_TOP_PAD_BYTES
    monkeypatch.setenv(heap.ENV_VAR, str(2**20))
    assert heap.keep_freed_memory() == 2**20
    for off in ("0", "-1", "lots"):
        monkeypatch.setenv(heap.ENV_VAR, off)
        assert heap.keep_freed_memory() is None
    monkeypatch.delenv(heap.ENV_VAR)
    monkeypatch.setenv("MALLOC_TOP_PAD_", "0")  # glibc's own setting wins
    assert heap.keep_freed_memory() is None
    monkeypatch.delenv("MALLOC_TOP_PAD_")
    assert heap.keep_freed_memory() == heap.DEFAULT_TOP_PAD_BYTES  # as the rest of the session had it


def test_importing_the_package_and_the_plots_leaves_matplotlib_and_mlflow_unloaded():
    code = (
        "import sys, runner, runner.plots, runner.training.progress, runner.heap; "
        "print(sorted(m for m in ('matplotlib', 'mlflow', 'tensorflow') if m in sys.modules))"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "[]"


def test_bench_variants_parse_overrides_and_environment():
    from bench.variants import parse_variant

    reference = parse_variant("reference+heap=MALLOC_TOP_PAD_=67108864", 2)
    assert reference.is_reference and reference.env == ("MALLOC_TOP_PAD_=67108864",) and reference.replicas == 2
    loop = parse_variant("multi_step", 1)
    assert not loop.is_reference and loop.overrides == ("loop=multi_step",)
    tuned = parse_variant("fast=loop=multi_step loop.steps_per_call=50 RUNNER_MALLOC_TOP_PAD=0", 1)
    assert tuned.overrides == ("loop=multi_step", "loop.steps_per_call=50")
    assert tuned.env == ("RUNNER_MALLOC_TOP_PAD=0",)
    assert parse_variant("deterministic", 1).overrides == ("runtime.deterministic=true",)
    assert parse_variant("multi_step+deterministic", 2).overrides == ("loop=multi_step", "runtime.deterministic=true")
    with pytest.raises(ValueError):
        parse_variant("reference=loop=for_in", 1)


def test_bench_fit_variants_run_the_reference_script_with_model_fit():
    from bench.variants import Workload, parse_variant

    work = Workload(None, 1000, 3)
    fit, fit20 = parse_variant("fit", 1), parse_variant("fit20", 1)
    assert fit.is_reference and fit20.is_reference and fit.marker == fit20.marker
    assert fit.command(work, "/tmp/x", "sqlite:///x.db")[-2:] == ["--fit", "--steps-per-execution=1"]
    assert fit20.command(work, "/tmp/x", "sqlite:///x.db")[-2:] == ["--fit", "--steps-per-execution=20"]
    assert "--fit" not in parse_variant("reference", 1).command(work, "/tmp/x", "sqlite:///x.db")
    assert parse_variant("fitness=loop=multi_step", 1).overrides == ("loop=multi_step",)  # a runner variant
    with pytest.raises(ValueError):
        parse_variant("fit20=loop=for_in", 1)


def test_bench_ratios_take_a_variant_against_its_own_baseline():
    from bench.report import Sample, markdown_table, slowest_rounds_table, summarise

    def sample(variant, round_, speed):
        return Sample(variant, 1, round_, (), (1.0, speed, speed), 5.0, 10.0)

    samples = [
        sample("fit", 0, 100),
        sample("fit20", 0, 200),
        sample("for_in", 0, 110),
        sample("multi_step", 0, 180),
        sample("fit", 1, 50),
        sample("fit20", 1, 100),
        sample("for_in", 1, 60),
        sample("multi_step", 1, 110),
    ]
    rows = {row.variant: row for row in summarise(samples, "fit", {"multi_step": "fit20"})}
    assert rows["for_in"].baseline == "fit" and rows["for_in"].speed_ratio.low == pytest.approx(1.1)
    assert rows["multi_step"].baseline == "fit20"
    assert (rows["multi_step"].speed_ratio.low, rows["multi_step"].speed_ratio.high) == pytest.approx((0.9, 1.1))
    # The slowest round of each against the slowest round of its baseline: 60/50, 110/100.
    assert rows["for_in"].slowest_ratio == pytest.approx(1.2)
    assert rows["multi_step"].slowest_ratio == pytest.approx(1.1)
    table = markdown_table(list(rows.values()), "fit")
    assert "| 1 | multi_step | 145 (110-180) | 1.00 (0.90-1.10) x fit20 |" in table
    assert "| 1 | for_in | 85.00 (60.00-110.00) | 1.15 (1.10-1.20) |" in table
    slowest = slowest_rounds_table(list(rows.values()))
    assert "| 1 | for_in | 60 | 1.20 fit |" in slowest and "| 1 | multi_step | 110 | 1.10 fit20 |" in slowest


def test_bench_ratios_pair_each_run_with_the_reference_of_its_round():
    from bench.report import Sample, markdown_table, summarise

    def sample(variant, round_, speed, first_step):
        # Epoch 1 (tracing) is left out: its speed must not count.
        return Sample(variant, 1, round_, (), (1.0, speed, speed), first_step, 10.0)

    # The machine is twice as fast in round 1: paired ratios stay 1.5 and 1.2, unpaired medians would not.
    samples = [
        sample("reference", 0, 100, 5.0),
        sample("for_in", 0, 150, 6.0),
        sample("reference", 1, 200, 2.5),
        sample("for_in", 1, 300, 3.0),
    ]
    reference, for_in = summarise(samples)
    assert (reference.speed_ratio.median, reference.first_step_ratio.median) == (1.0, 1.0)
    assert for_in.speed_ratio.low == for_in.speed_ratio.high == pytest.approx(1.5)
    assert for_in.first_step_ratio.median == pytest.approx(1.2)
    assert for_in.examples_per_second.median == 225
    assert "| 1 | for_in | 225 (150-300) | 1.50 (1.50-1.50) |" in markdown_table([reference, for_in])


def test_bench_reports_saved_samples_against_another_baseline(tmp_path, capsys):
    from bench.report import Sample
    from bench.run import main, save

    def sample(variant, round_, speed):
        return Sample(variant, 1, round_, (), (1.0, speed, speed), 5.0, 10.0)

    samples = [
        sample("reference", 0, 100),
        sample("reference+heap", 0, 200),
        sample("for_in", 0, 220),
        sample("reference", 1, 50),
        sample("reference+heap", 1, 100),
        sample("for_in", 1, 105),
    ]
    saved = tmp_path / "bench.json"
    save(str(saved), {"machine": "a test machine", "workload": "two rounds", "title": "t"}, samples)
    table = tmp_path / "table.md"
    main(["--from-json", str(saved), "--baseline", "reference+heap", "--markdown", str(table)])
    text = table.read_text()
    assert text.startswith("Machine: a test machine.") and text == capsys.readouterr().out.rstrip("\n") + "\n"
    assert "| x reference+heap |" in text
    assert "| 1 | reference | 75.00 (50.00-100.00) | 0.50 (0.50-0.50) |" in text
    assert "| 1 | for_in | 162 (105-220) | 1.08 (1.05-1.10) |" in text  # 220/200 and 105/100, round by round
    with pytest.raises(SystemExit, match="no runs of the baseline 'nonexistent'"):
        main(["--from-json", str(saved), "--baseline", "nonexistent"])


@pytest.mark.slow
@pytest.mark.parametrize("fit", [[], ["--fit", "--steps-per-execution=2"]], ids=["loop", "fit"])
def test_the_reference_script_trains_and_reports(tmp_path, fit):
    """The tutorial's loop (or model.fit on the same model), standalone: no runner, Hydra or MLflow is imported."""
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "reference.py"),
            "--train-examples=256",
            "--test-examples=64",
            "--epochs=2",
            "--strategy=one_device",
            *fit,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    events = [json.loads(line[len("BENCH ") :]) for line in done.stdout.splitlines() if line.startswith("BENCH ")]
    assert [event["event"] for event in events] == ["first_step", "epoch", "epoch"]
    assert all(event["examples_per_second"] > 0 for event in events[1:])
    source = (REPO / "bench" / "reference.py").read_text()
    assert "import runner" not in source and "hydra" not in source and "mlflow" not in source


@pytest.mark.slow
def test_startup_breakdown_times_what_each_library_adds_in_fresh_interpreters():
    from bench.startup import PHASES, markdown_table, measure

    costs = measure(repeats=1)
    assert list(costs) == [name for name, _, _ in PHASES[1:]]
    # Real interpreters doing real work: importing TensorFlow alone takes seconds. (The smaller phases are
    # differences of two timings, which one round cannot tell from noise.)
    assert costs["tensorflow"] > 0.5, costs
    table = markdown_table(costs)
    assert all(f"| {name} | {costs[name]:.2f} |" in table for name in costs)


def test_the_sweeper_bookkeeping_bench_runs_the_sweeper_with_a_stand_in_launch(tmp_path, capsys):
    """bench/sweeper_bookkeeping.py at its smallest (10 trials, journal storage): the runner's Optuna sweeper runs
    its study to the end with the stand-in launch, and the table and the JSON have every column."""
    from bench.sweeper_bookkeeping import COLUMNS, main

    saved = tmp_path / "bookkeeping.json"
    main(["--trials", "10", "--storage", "journal", "--json", str(saved)])
    [row] = json.loads(saved.read_text())["rows"]
    assert tuple(row) == COLUMNS and row["storage"] == "journal file" and row["trials"] == 10
    assert all(row[column] > 0 for column in COLUMNS[2:])
    out = capsys.readouterr().out
    assert "| storage | trials | ask ms | record ms | tell ms | summary ms/row |" in out
    assert out.rstrip().splitlines()[-1].startswith("| journal file | 10 | ")


def test_the_sweeps_benchmark_runs_the_studies_asked_and_tables_the_best_trial_by_its_objective(tmp_path):
    """bench.sweeps: `--studies` picks among the studies (successive halving only when asked), the median pruner alone
    gets the startup-trials override, and the table shows the best val_accuracy with its test_accuracy beside it."""
    from bench import sweeps

    assert "successive_halving, serial" not in sweeps.parse_args([]).studies
    args = sweeps.parse_args(["--studies", "successive_halving, serial", "median, 2 slots", "--startup-trials", "3"])
    chosen = dict(study for study in sweeps.STUDIES if study[0] in args.studies)
    halving = sweeps.command(args, tmp_path, chosen["successive_halving, serial"], seed=42)
    median = sweeps.command(args, tmp_path, chosen["median, 2 slots"], seed=7)
    assert "hydra.sweeper.sampler.seed=42" in halving and "hydra.sweeper.sampler.seed=7" in median
    assert sweeps.parse_args([]).seed == [42] and sweeps.parse_args(["--seed", "1", "2"]).seed == [1, 2]
    assert "pruner=successive_halving" in halving and not any("n_startup_trials" in item for item in halving)
    assert "pruner.n_startup_trials=3" in median and "hydra.launcher.n_jobs=2" in median
    with pytest.raises(SystemExit):
        sweeps.parse_args(["--studies", "median"])  # not a study's name
    row = {
        "study": "median, serial",
        "trials": 16,
        "pruned": 5,
        "epochs": 49,
        "wall_seconds": 738.2,
        "best_val_accuracy": 0.89471,
        "best_test_accuracy": 0.89612,
        "idle_fraction": 0.0421,
        "first_step_seconds": 4.93,
        "last_epoch_to_end_seconds": 1.14,
    }
    assert (
        sweeps.table([row]).splitlines()[-1]
        == "| median, serial | 16 (5) | 49 | 738 | 0.8947 (0.8961) | 4.2% | 4.9 | 1.1 |"
    )
    assert sweeps.table([{**row, "seed": 3}]).splitlines()[-1].startswith("| median, serial, seed 3 | 16 (5) |")


def test_the_sweeps_benchmark_sets_each_pruned_study_against_the_unpruned_one_of_its_seed_and_slots():
    """bench.sweeps' last table: a pruned study's epochs as a fraction of the unpruned study's with the same sampler
    seed and slots (not another seed's, nor the serial one's for two slots), and its best objective's difference."""
    from bench.sweeps import against_unpruned

    def row(study, seed, pruned, epochs, best):
        return dict(study=study, seed=seed, trials=16, pruned=pruned, epochs=epochs, best_val_accuracy=best)

    rows = [
        row("none, serial", 1, 0, 64, 0.88),
        row("median, serial", 1, 5, 48, 0.87),
        row("none, serial", 2, 0, 60, 0.90),
        row("median, serial", 2, 10, 30, 0.905),
        row("none, 2 slots", 2, 0, 50, 0.80),
        row("median, 2 slots", 2, 4, 40, 0.81),
        row("median, 2 slots", 3, 4, 40, 0.81),  # no unpruned study of seed 3: not tabled
    ]
    lines = against_unpruned(rows).splitlines()
    assert lines[2:] == [
        "| 1 | median, serial | 5 of 16 | 48 (0.75x) | 0.8700 (-0.0100) |",
        "| 2 | median, serial | 10 of 16 | 30 (0.50x) | 0.9050 (+0.0050) |",
        "| 2 | median, 2 slots | 4 of 16 | 40 (0.80x) | 0.8100 (+0.0100) |",
    ]

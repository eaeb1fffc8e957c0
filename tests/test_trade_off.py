"""Sweeps over several objectives and with constraints, in pieces (runner.config.objective, runner.sweeps.pareto, the
summary, the report, the Optuna sweeper with a stand-in launch): the Pareto front against a brute-force one, each
refusal one paragraph, an infeasible configuration never chosen. End to end: tests/test_optuna_sweeps.py."""

from __future__ import annotations

import itertools
import math
import random

import optuna
import pytest
from omegaconf import OmegaConf

from helpers.sweeps import StandInLauncher
from runner.config.check import compose_config
from runner.config.objective import Constraint
from runner.errors import RunnerError
from runner.metric_table import DEFAULT_TABLE
from runner.sweeps.pareto import dominates, pareto_front
from runner.sweeps.plugins.optuna_sweeper import OptunaSweep
from runner.sweeps.report.report import front_figure
from runner.sweeps.report.summary import ConfigurationRow, JobRow, Summary, broken_constraints
from runner.sweeps.study.pruning import check_sweep
from runner.sweeps.study.study import open_storage
from runner.sweeps.sweep_config import SweepConfig, storage_of


def test_the_front_is_every_point_no_other_beats_on_both_objectives_whatever_their_directions():
    rng = random.Random(3)
    points = {f"c{i}": [round(rng.random(), 1), round(rng.random(), 1)] for i in range(40)}  # ties included

    def beaten(values, others, signs):
        mine = [s * v for s, v in zip(signs, values, strict=True)]
        return any(
            all(s * o <= m for s, o, m in zip(signs, other, mine, strict=True)) and other != values for other in others
        )

    for lower in itertools.product((True, False), repeat=2):
        signs = [1 if low else -1 for low in lower]
        brute = [name for name, values in points.items() if not beaten(values, list(points.values()), signs)]
        assert pareto_front(points, list(lower)) == brute
    assert dominates([0.9, 10], [0.8, 10], [False, True]) and not dominates([0.9, 10], [0.9, 10], [False, True])
    assert not dominates([0.9, 20], [0.8, 10], [False, True])  # better on one, worse on the other


def _row(job: int, configuration: str, seed: str, **metrics: float) -> JobRow:
    return JobRow(
        job,
        configuration,
        configuration,
        "FINISHED",
        dict(metrics),
        1.0,
        f"r{job}{seed}",
        "",
        seed=seed,
        configuration=configuration,
    )


def _summary(constraints=(), trade_off=(("val_accuracy", False), ("parameters", True))) -> Summary:
    """Four configurations of two seeds each: wide is the most accurate and the largest, narrow the smallest, mid
    between them, and worse is beaten by mid on both objectives."""
    values = {"wide": (0.90, 400_000), "mid": (0.85, 120_000), "narrow": (0.70, 40_000), "worse": (0.80, 130_000)}
    rows, number = [], 0
    for name, (accuracy, parameters) in values.items():
        for seed, step in (("1", 0.01), ("2", -0.01)):
            metrics = {"val_accuracy": accuracy + step, "parameters": parameters, "val_loss": 1 - accuracy}
            rows.append(_row(number, name, seed, **metrics))
        number += 1
    configurations = [ConfigurationRow(name, [row for row in rows if row.configuration == name]) for name in values]
    feasible = [row for row in configurations if not broken_constraints(row, constraints)]
    best = max(feasible, key=lambda row: row.mean("val_accuracy"))
    return Summary(
        "sweep",
        "p",
        "val_accuracy",
        rows,
        best.finished[0],
        configurations,
        best,
        True,
        trade_off=trade_off,
        constraints=constraints,
    )


def test_the_summary_shows_the_front_and_an_infeasible_configuration_is_never_chosen():
    summary = _summary()
    assert [row.configuration for row in summary.front] == ["wide", "mid", "narrow"]
    assert summary.best_configuration.configuration == "wide"
    markdown = summary.markdown()
    assert (
        "Pareto front over val_accuracy (higher is better) and parameters (lower is better): 3 configuration(s)"
        in markdown
    )
    assert "- mid (n=2): val_accuracy 0.8500 ± 0.0141 [" in markdown and "parameters 120000 ± 0" in markdown
    assert "(Student-t (n=2))" in markdown

    constrained = _summary(constraints=(Constraint.parse("parameters <= 200000", DEFAULT_TABLE),))
    wide = next(row for row in constrained.configurations if row.configuration == "wide")
    assert constrained.best_configuration.configuration == "mid"  # the best feasible one
    assert [row.configuration for row in constrained.front] == ["mid", "narrow"]
    assert constrained.verdict(wide, {}) == "infeasible (sweep.constraints): parameters 400000 > 200000"
    text = constrained.markdown()
    assert "infeasible, never chosen: wide (parameters 400000 > 200000)" in text
    figure = front_figure(constrained)
    drawn = {trace.name: list(trace.text) for trace in figure.data}
    assert drawn == {"on the front": ["narrow", "mid"], "behind it": ["worse"], "infeasible": ["wide"]}

    # Three objectives: parallel coordinates over them, the front's lines apart from the others'.
    three = _summary(trade_off=(("val_accuracy", False), ("parameters", True), ("val_loss", True)))
    [lines] = front_figure(three).data
    assert [dimension.label for dimension in lines.dimensions] == ["val_accuracy", "parameters", "val_loss"]
    on_front = {row.configuration for row in three.front}
    assert list(lines.line.color) == [float(row.configuration in on_front) for row in three.configurations]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("parameters < 5", "a constraint is a metric, <= or >=, and a number"),
        ("parameters <= many", "a constraint is a metric, <= or >=, and a number"),
        ("params <= 5", "params is not a number a finished run logs"),
    ],
)
def test_a_constraint_that_cannot_be_read_is_one_paragraph(text, said):
    with pytest.raises(RunnerError) as raised:
        Constraint.parse(text, DEFAULT_TABLE)
    message = str(raised.value)
    assert message.startswith(f"sweep.constraints item {text!r} is not valid: {said}") and "Fix:" in message
    assert Constraint.parse(" latency_ms >= 0.5 ", DEFAULT_TABLE).violation(0.25) == 0.25


def _sweep(tmp_path, *overrides: str):
    config = compose_config(
        ["hparams_search=optuna", f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides], return_hydra_config=True
    )
    return config


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (
            ["sweep.objective=[val_accuracy,parameters]", "sweep.direction=maximize"],
            "sweep.direction=maximize is not valid: the sweep has 2 objective(s)",
        ),
        (
            ["sweep.objective=[val_accuracy,parameters]", "sweep.choose=val_loss"],
            "sweep.choose=val_loss is not valid: it must be one of the objectives",
        ),
        (
            ["sweep.objective=[val_accuracy,val_accuracy]"],
            "sweep.objective=[val_accuracy,val_accuracy] is not valid: it names an objective twice",
        ),
        (
            ["sweep.objective=[val_accuracy,parameters]", "pruner=median"],
            "pruner='median' is not valid: a pruner stops a trial",
        ),
        (
            ["sweep.objective=[val_accuracy,parameters]", "hydra.sweeper.terminate=regret", "sweep.seeds=2"],
            "hydra.sweeper.terminate='regret' is not valid: it stops a study",
        ),
        (["sweep.constraints=['size <= 3']"], "sweep.constraints item 'size <= 3' is not valid"),
    ],
)
def test_a_trade_off_that_cannot_be_run_is_one_paragraph_before_the_sweep_starts(tmp_path, overrides, said):
    with pytest.raises(RunnerError) as raised:
        config = _sweep(tmp_path, *overrides)
        check_sweep(config, SweepConfig.read(config))
    message = str(raised.value)
    assert message.startswith(said) and "Fix:" in message and "\n" not in message, message


def test_an_optuna_study_of_two_objectives_is_told_both_and_writes_its_front(tmp_path):
    """The stand-in answers each trial's (accuracy, parameters) from its width; Optuna's front is the widths no
    other beats on both, and a width proposed again is told its original's values."""
    config = _sweep(
        tmp_path,
        "sweep.objective=[val_accuracy,parameters]",
        "hydra.sweeper.n_trials=6",
        "hydra.sweeper.sampler.seed=5",
    )
    OmegaConf.update(config, "hydra.sweeper.params", {"+model.dense_units": "choice(16, 64, 256)"}, merge=False)
    answers = {"16": [0.70, 44_000.0], "64": [0.85, 122_000.0], "256": [0.84, 431_000.0]}

    def answer(overrides):
        return answers[dict(item.split("=", 1) for item in overrides)["+model.dense_units"]]

    sweep = SweepConfig.read(config)
    assert sweep.goals.study_directions == ["maximize", "minimize"]
    OptunaSweep(config, StandInLauncher(answer=answer)).run([])
    study = optuna.load_study(
        study_name="fashion_mnist", storage=open_storage(storage_of(None, str(tmp_path / "sweep")))
    )
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    assert all(trial.values == answers[str(trial.params["+model.dense_units"])] for trial in study.trials)
    front = sorted({str(trial.params["+model.dense_units"]) for trial in study.best_trials})
    assert front == sorted(
        width
        for width in answers
        if width != "256" and any(str(t.params["+model.dense_units"]) == width for t in study.trials)
    )
    results = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    assert sorted(str(item.params["+model.dense_units"]) for item in results.solutions) == sorted(
        str(trial.params["+model.dense_units"]) for trial in study.best_trials
    )
    assert not math.isnan(results.solutions[0]["values"][0])


@pytest.mark.slow  # a `python -m runner` process
def test_pruning_a_study_of_two_objectives_exits_2_with_one_paragraph_and_no_run(tmp_path):
    from helpers.cli import run_cli

    done = run_cli(
        "-m",
        "hparams_search=optuna",
        "sweep.objective=[val_accuracy,parameters]",
        "pruner=median",
        f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
        timeout=120,
    )
    said = done.stderr.strip().splitlines()
    assert done.returncode == 2 and said[-1].startswith("error: pruner='median' is not valid: a pruner stops"), said
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "sweep" / "optuna_study.journal").exists()

"""Hydra's Optuna sweeper's remaining options under the runner's sweeper (hydra.sweeper.custom_search_space and
max_failure_rate), its study run with a stand-in launch that answers at once; and a config written for
hydra-optuna-sweeper (lightning-hydra-template's hparams_search style), which runs under the runner's sweeper once
the line naming Hydra's sweeper is gone, and is refused in one paragraph while it is there."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from helpers.cli import run_cli
from helpers.config import REPO
from helpers.sweeps import StandInLauncher
from runner.config.check import compose_config
from runner.errors import RunnerError
from runner.sweeps.plugins.lifecycle import refuse_hydras_optuna_sweeper
from runner.sweeps.plugins.optuna_sweeper import OptunaSweep, check_settings
from runner.sweeps.sweep_config import SweepConfig


def _sweep_config(tmp_path, *overrides: str, lr: str = "choice(0.01, 0.001)"):
    """The composed config of `python -m runner -m hparams_search=optuna <overrides>`, its `hydra` node included,
    searching optimizer.lr alone (`lr`)."""
    base = ["hparams_search=optuna", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.sampler.seed=3"]
    config = compose_config([*base, *overrides], return_hydra_config=True)
    OmegaConf.update(config, "hydra.sweeper.params", {"optimizer.lr": lr}, merge=False)
    return config


def test_the_documented_custom_search_space_draws_a_momentum_for_the_sgd_trials_alone(tmp_path, monkeypatch):
    """docs/sweeps.md's example (examples/mylab/mylab/search.py), as Hydra's Optuna sweeper calls it: with the
    sweep's config and each new trial, after the trial's params are drawn; what it suggests is that trial's
    override too, and only that trial's."""
    monkeypatch.syspath_prepend(str(REPO / "examples" / "mylab"))
    config = _sweep_config(
        tmp_path,
        "hydra.sweeper.n_trials=8",
        "hydra.sweeper.sampler.n_startup_trials=8",
        "hydra.sweeper.custom_search_space=mylab.search.momentum_for_sgd",
    )
    OmegaConf.update(config, "hydra.sweeper.params", {"optimizer": "choice(adam, sgd)"}, merge=False)
    check_settings(config, SweepConfig.read(config))  # it imports
    launcher = StandInLauncher()
    OptunaSweep(config, launcher).run([])
    assert len(launcher.launched) >= 4  # a repeated configuration (two Adam trials) is told, not launched
    for _, overrides in launcher.launched:
        values = dict(item.split("=", 1) for item in overrides)
        assert ("optimizer.momentum" in values) == (values["optimizer"] == "sgd"), overrides
        assert 0.0 <= float(values.get("optimizer.momentum", 0.5)) <= 0.99
    assert {dict(item.split("=", 1) for item in o)["optimizer"] for _, o in launcher.launched} == {"adam", "sgd"}

    with pytest.raises(RunnerError, match=r"^hydra.sweeper.custom_search_space='mylab.search.nothing'"):
        bad = _sweep_config(tmp_path, "hydra.sweeper.custom_search_space=mylab.search.nothing")
        check_settings(bad, SweepConfig.read(bad))


@pytest.mark.parametrize(("rate", "launched"), [(0.0, 2), (0.5, 5), (None, 6)])
def test_max_failure_rate_stops_asking_once_more_than_that_share_of_the_ended_trials_failed(tmp_path, rate, launched):
    """Every trial fails but the first and the third: at 0 the first failure ends the study (trial 1's), at 0.5 the
    failure that makes them more than half of the ended trials (trial 4's: 3 of 5), and without a limit every trial
    runs, the failures failing alone."""
    count = iter(range(100))
    launcher = StandInLauncher(fails=lambda overrides: next(count) not in (0, 2))
    limit = f"hydra.sweeper.max_failure_rate={'null' if rate is None else rate}"
    # A continuous space: no configuration is proposed twice (a repeat is told its original's result, not launched).
    config = _sweep_config(tmp_path, "hydra.sweeper.n_trials=6", limit, lr="interval(0.0001, 0.1)")
    OptunaSweep(config, launcher).run([])
    assert len(launcher.launched) == launched
    with pytest.raises(RunnerError, match=r"^hydra.sweeper.max_failure_rate=1.5 is not valid: it must be a number fr"):
        SweepConfig.read(_sweep_config(tmp_path, "hydra.sweeper.max_failure_rate=1.5"))


# lightning-hydra-template's configs/hparams_search/mnist_optuna.yaml, with the runner's keys.
LIGHTNING_STYLE = """# @package _global_
defaults:
  - override /hydra/sweeper: optuna

hydra:
  mode: "MULTIRUN"
  sweeper:
    _target_: hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper
    storage: null
    study_name: null
    n_jobs: 1
    direction: maximize
    n_trials: 2
    sampler:
      _target_: optuna.samplers.TPESampler
      seed: 1234
      n_startup_trials: 10
    params:
      optimizer.lr: interval(0.0001, 0.1)
      batch: choice(32, 64, 128, 256)
"""


def test_a_config_written_for_hydras_optuna_sweeper_runs_without_the_line_naming_that_sweeper(tmp_path):
    conf = tmp_path / "conf" / "hparams_search"
    conf.mkdir(parents=True)
    (conf / "mnist_optuna.yaml").write_text(LIGHTNING_STYLE)
    searchpath = f"hydra.sweepath=[file://{tmp_path / 'conf'}]".replace("sweepath", "searchpath")

    done = run_cli("-m", searchpath, "hparams_search=mnist_optuna", "progress=false", cwd=tmp_path, timeout=120)
    said = done.stderr.strip().splitlines()
    assert done.returncode == 2 and said[-1].startswith(
        "error: hydra.sweeper._target_=hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper is Hydra's "
        "Optuna sweeper, which the runner replaces"
    ), done.stderr[-2000:]
    assert "Fix: drop the `_target_` line" in said[-1] and "Traceback" not in done.stderr
    assert not (tmp_path / "mlflow.db").exists()  # refused before the parent run

    (conf / "mnist_optuna.yaml").write_text(LIGHTNING_STYLE.replace("    _target_: hydra_plugins.hydra", "    # "))
    config = compose_config([searchpath, "hparams_search=mnist_optuna"], return_hydra_config=True)
    refuse_hydras_optuna_sweeper(config)
    sweep = SweepConfig.read(config)
    check_settings(config, sweep)
    assert sweep.optuna is not None and sweep.study is not None
    assert (sweep.optuna.n_trials, sweep.goal.study_direction, sweep.study.name) == (2, "maximize", "runner")
    assert sweep.optuna.params == {"optimizer.lr": "interval(0.0001, 0.1)", "batch": "choice(32, 64, 128, 256)"}

    with pytest.raises(RunnerError, match=r"^hydra.sweeper.search_space is not a key of the runner's Optuna sweep"):
        OmegaConf.update(config, "hydra.sweeper.search_space", {"batch": {"type": "categorical"}}, force_add=True)
        SweepConfig.read(config)


def test_a_sweeps_journal_opens_in_optuna_dashboard_with_its_trials(tmp_path):
    """docs/sweeps.md: `optuna-dashboard <sweep dir>/optuna_study.journal`. The dashboard's own WSGI app, given the
    journal's path as its command line is, lists the study with each of its trials, a pruned one and the runner's
    user attributes included."""
    import io
    import json
    from wsgiref.util import setup_testing_defaults

    import optuna
    from optuna_dashboard import wsgi

    from runner.sweeps.study.study import open_storage
    from runner.sweeps.sweep_config import storage_of

    journal = storage_of(None, str(tmp_path / "sweep"))
    study = optuna.create_study(study_name="fashion_mnist", storage=open_storage(journal), direction="maximize")
    for value, pruned in ((0.8, False), (0.6, True), (0.85, False)):
        trial = study.ask({"optimizer.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)})
        trial.set_user_attr("replicate_values", [value, value + 0.01])
        trial.report(value, 1)
        study.tell(trial, None if pruned else value, state=optuna.trial.TrialState.PRUNED if pruned else None)

    app = wsgi(journal)

    def get(path: str):
        environ: dict = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "wsgi.input": io.BytesIO()}
        setup_testing_defaults(environ)
        status: list[str] = []
        body = b"".join(app(environ, lambda code, headers, *rest: status.append(code)))
        assert status[0].startswith("200"), (path, status, body[:500])
        return json.loads(body)

    [summary] = get("/api/studies")["study_summaries"]
    assert summary["study_name"] == "fashion_mnist"
    detail = get(f"/api/studies/{summary['study_id']}")
    states = [trial["state"] for trial in detail["trials"]]
    assert states == ["Complete", "Pruned", "Complete"], states
    assert detail["best_trials"][0]["values"] == [0.85]

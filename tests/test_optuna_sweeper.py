"""The runner's Optuna sweeper in pieces, with a real Optuna (in memory or a journal file in tmp_path): Hydra's
`params` syntax as distributions, the study's storage, the pruning listener, the summary of pruned trials.
End to end (real sweeps of `python -m runner` processes): tests/test_optuna_sweeps.py."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from helpers.sweeps import StandInLauncher
from runner.errors import RunnerError
from runner.sweeps.plugins.optuna_sweeper import launcher_parallelism
from runner.sweeps.report.summary import ConfigurationRow, JobRow, Summary
from runner.sweeps.study.grid_study import GRID_STUDY, JobTrial, create_grid_study
from runner.sweeps.study.pruning import TrialReporter, check_sweep
from runner.sweeps.study.study import PRUNED_TAG, SearchSpace, TrialLink, open_storage
from runner.sweeps.sweep_config import BASIC_SWEEPER, SweepConfig, storage_of
from runner.sweeps.terms import JOURNAL_FILE


def test_hydra_params_become_optuna_distributions_and_a_command_line_sweep_wins():
    space = SearchSpace.parse(
        {
            "optimizer.lr": "tag(log, interval(0.0001, 0.01))",
            "batch": "choice(32, 64, 128)",
            "epochs": "range(1, 4)",
            "model": {"dropout": "interval(0.1, 0.5)"},  # nested, as hydra.sweeper.params.model.dropout=... gives it
            "loop.steps_per_call": [1, 4],  # a plain YAML list is a choice
            "seed": "3",
        },
        ["batch=16,32", "strategy=one_device"],
    )
    assert space.distributions == {
        "optimizer.lr": FloatDistribution(0.0001, 0.01, log=True),
        "epochs": IntDistribution(1, 3),  # Hydra's range excludes its stop
        "model.dropout": FloatDistribution(0.1, 0.5),
        "loop.steps_per_call": CategoricalDistribution([1, 4]),
        "batch": CategoricalDistribution([16, 32]),
    }
    assert space.fixed == {"seed": "3", "strategy": "one_device"}
    overrides = space.overrides({"optimizer.lr": 0.00123456789012, "batch": 32})
    assert overrides == ["seed=3", "strategy=one_device", "optimizer.lr=0.00123456789012", "batch=32"]


def test_the_study_is_a_journal_file_in_the_sweep_directory_unless_storage_names_one(tmp_path):
    assert storage_of(None, str(tmp_path)) == str(tmp_path / JOURNAL_FILE)
    assert storage_of("postgresql://me@db/optuna", str(tmp_path)) == "postgresql://me@db/optuna"
    storage = open_storage(storage_of(None, str(tmp_path / "sweep")))
    study = optuna.create_study(study_name="s", storage=storage)
    study.tell(study.ask(), 1.0)
    # Another process (a job's training) opens the same study and trial by number.
    _, trial = TrialLink(storage_of(None, str(tmp_path / "sweep")), "s", 0).open()
    assert trial.number == 0


def test_storage_that_cannot_be_opened_is_one_paragraph_without_the_password(tmp_path):
    with pytest.raises(RunnerError) as raised:
        open_storage("postgresql://me:secret@127.0.0.1:1/optuna")
    message = str(raised.value)
    assert message.startswith("hydra.sweeper.storage='postgresql://me:***@127.0.0.1:1/optuna' could not be opened")
    assert "secret" not in message and "Fix:" in message


class _Epoch:
    def __init__(self, epoch: int, accuracy: float):
        self.epoch, self.accuracy = epoch, accuracy

    def metrics(self) -> dict[str, float]:
        return {"test_accuracy": self.accuracy, "train_loss": 1.0}


def test_a_trial_behind_the_median_asks_to_stop_at_that_epoch_and_the_study_knows_it():
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    good = study.ask()
    for epoch, value in enumerate((0.5, 0.7, 0.8), start=1):
        good.report(value, epoch)
    study.tell(good, 0.8)
    reporter = TrialReporter(study.ask(), "test_accuracy")
    reporter.on_epoch_end(_Epoch(1, 0.6))
    assert not reporter.stop_requested
    reporter.on_epoch_end(_Epoch(2, 0.1))
    assert reporter.stop_requested and reporter.pruned_at_epoch == 2
    assert study.trials[1].user_attrs[PRUNED_TAG] == 2
    assert study.trials[1].intermediate_values == {1: 0.6, 2: 0.1}


def _row(job: int, configuration: str, accuracy: float, pruned: int | None = None, status="FINISHED") -> JobRow:
    return JobRow(
        job=job,
        overrides=configuration,
        all_overrides=configuration,
        status=status,
        metrics={"test_accuracy": accuracy} if status == "FINISHED" else {},
        wall_seconds=10.0,
        run_id=f"run{job}",
        error="" if status == "FINISHED" else "boom",
        configuration=configuration,
        pruned_at_epoch=pruned,
    )


def test_the_summary_counts_pruned_trials_apart_from_failed_ones_and_never_picks_one():
    rows = [_row(0, "lr=0.01", 0.8), _row(1, "lr=1e-09", 0.95, pruned=1), _row(2, "lr=0.1", math.nan, status="FAILED")]
    configurations = [ConfigurationRow(row.configuration, [row]) for row in rows]
    summary = Summary("sweep", "p", "test_accuracy", rows, rows[0], configurations, configurations[0])
    assert summary.failed == [rows[2]] and summary.pruned == [rows[1]]
    markdown = summary.markdown()
    assert "3 jobs, 1 finished, 1 pruned, 1 failed, in 3 configurations" in markdown
    assert "| lr=1e-09 | pruned at epoch 1 |" in markdown
    assert "1 pruned: job 1 (lr=1e-09) at epoch 1" in markdown
    assert "| 1 | lr=1e-09 | pruned at epoch 1 | " in summary.jobs_markdown()
    assert configurations[1].pruned and not configurations[1].complete
    assert configurations[0].complete


def test_parallel_slots_follow_the_launcher():
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher

    from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
    from hydra_plugins.runner_submitit_launchers import LocalLauncher

    assert launcher_parallelism(JoblibLauncher(n_jobs=3)) == 3
    assert launcher_parallelism(LocalLauncher(array_parallelism=4, submitit_folder="x")) == 4
    assert launcher_parallelism(BasicLauncher()) == 1


def _grid_config(*overrides: str, sweeper: str = BASIC_SWEEPER):
    """The composed config of `python -m runner -m <overrides>` with Hydra's node as the sweep callback sees it."""
    from omegaconf import OmegaConf

    from helpers.config import compose

    composed = OmegaConf.to_container(compose(list(overrides)), resolve=True)
    return OmegaConf.create({**composed, "hydra": {"sweeper": {"_target_": sweeper}}})


def _read(config):
    """A sweep's composed config and what it asks, read, as check_sweep takes them."""
    return config, SweepConfig.read(config)


def test_a_pruner_is_valid_in_a_grid_sweep_with_seeds_and_folds_but_not_with_another_sweeper():
    check_sweep(*_read(_grid_config("pruner=median", "sweep.objective=test_loss")))
    # A trial's seeds and folds report one after another (TrialLink.first_step).
    check_sweep(*_read(_grid_config("pruner=median", "sweep.objective=test_loss", "sweep.folds=3", "sweep.seeds=2")))
    with pytest.raises(
        RunnerError,
        match=r"^pruner='median' is not valid: hydra.sweeper._target_=my.Sweeper reports its trials to no study",
    ):
        check_sweep(*_read(_grid_config("pruner=median", "sweep.objective=test_loss", sweeper="my.Sweeper")))


def test_a_grid_job_continues_its_running_trial_and_asks_a_new_one_after_a_failure(tmp_path):
    """A killed job's re-run reports to the trial it left RUNNING; a failed job's trial is FAIL, and its re-run
    reports to a new trial: the study never holds two COMPLETE or PRUNED trials of one job."""
    from optuna.trial import TrialState

    config = _grid_config("pruner=median", "sweep.objective=test_loss")
    create_grid_study(SweepConfig.read(config), str(tmp_path))
    first = JobTrial(str(tmp_path), 0).open()
    assert JobTrial(str(tmp_path), 0).open() == first  # the killed attempt's trial, continued
    other = JobTrial(str(tmp_path), 1).open()
    assert other.number != first.number
    failed = JobTrial(str(tmp_path), 0)
    failed.open()
    failed.tell(None)
    rerun = JobTrial(str(tmp_path), 0)
    assert rerun.open().number not in (first.number, other.number)
    rerun.tell(0.5)
    study = optuna.load_study(study_name=GRID_STUDY, storage=open_storage(str(tmp_path / JOURNAL_FILE)))
    assert study.direction == optuna.study.StudyDirection.MINIMIZE  # a loss
    states = {trial.number: trial.state for trial in study.trials}
    assert states == {first.number: TrialState.FAIL, other.number: TrialState.RUNNING, 2: TrialState.COMPLETE}


def _optuna_sweep(
    tmp_path, n_trials: int, params: dict, n_jobs: int = 1, direction: str | None = "maximize"
) -> list[tuple[int, tuple[str, ...]]]:
    from omegaconf import OmegaConf

    from runner.config.check import compose_config
    from runner.sweeps.plugins.optuna_sweeper import OptunaSweep

    # The sweep's composed config with its `hydra` node, as Hydra hands it to the sweeper.
    config = compose_config(
        [
            "hparams_search=optuna",
            f"hydra.sweep.dir={tmp_path}",
            f"hydra.sweeper.direction={direction or 'null'}",
            f"hydra.sweeper.n_trials={n_trials}",
            f"hydra.sweeper.n_jobs={n_jobs}",
            "hydra.sweeper.study_name=s",
            "hydra.sweeper.sampler.seed=42",
            "hydra.sweeper.sampler.n_startup_trials=5",
            "sweep.direction_against_metric=true",  # the stand-in launcher's values are no accuracy
        ],
        return_hydra_config=True,
    )
    OmegaConf.update(config, "hydra.sweeper.params", params, merge=False)
    launcher = StandInLauncher()
    OptunaSweep(config, launcher).run([])
    return launcher.launched


def test_a_study_continued_with_another_direction_is_one_paragraph_naming_the_stored_one(tmp_path):
    """Optuna loads a stored study with the direction it was created with: a re-run that would rank the other way
    is refused, before any trial, instead of the study and the summary disagreeing on the best."""
    params = {"optimizer.lr": "interval(0.001, 0.1)"}
    _optuna_sweep(tmp_path, 1, params, direction="maximize")
    assert len(_optuna_sweep(tmp_path, 2, params, direction=None)) == 1  # null: val_accuracy's own, maximize
    with pytest.raises(RunnerError, match=r"^the Optuna study 's' in .* was created to maximize .* this sweep would "):
        _optuna_sweep(tmp_path, 3, params, direction="minimize")


def test_a_rerun_of_a_study_continues_its_samplers_draws_instead_of_repeating_them(tmp_path):
    """A command that ended after 2 of 6 trials (killed), run again: the sampler's seed moves on by the trials the
    study holds, so trials 2-5 are new draws, not trials 0 and 1 again (a sampler rebuilt with the same seed would
    repeat its start-up draws)."""
    from optuna.samplers import TPESampler

    from runner.sweeps.plugins.optuna_sweeper import continued_sampler

    space = {"optimizer.lr": "tag(log, interval(0.0001, 0.01))", "batch": "choice(32, 64, 128)"}
    first = _optuna_sweep(tmp_path, 2, space)
    second = _optuna_sweep(tmp_path, 6, space)
    assert [number for number, _ in first + second] == list(range(6))
    configurations = [overrides for _, overrides in first + second]
    assert len(set(configurations)) == 6, configurations
    # What the sampler of the re-run is: the configured one, its seed moved on by the trials already asked.
    node = {"_target_": "optuna.samplers.TPESampler", "seed": 42}
    from hydra.utils import instantiate

    assert continued_sampler(node, 0, instantiate)._rng.rng.random() == TPESampler(seed=42)._rng.rng.random()
    assert continued_sampler(node, 2, instantiate)._rng.rng.random() == TPESampler(seed=44)._rng.rng.random()


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_a_configuration_the_sampler_proposes_again_is_told_its_result_not_trained_twice(tmp_path, n_jobs, caplog):
    """A 2 x 2 space and 6 trials: 4 configurations train once each; the 2 trials proposing one of them again are
    told its result and marked `duplicate_of`, on one slot as on two (where the original may still be training)."""
    from runner.sweeps.study.study import DUPLICATE_ATTR

    caplog.set_level("INFO", logger="runner")
    launched = _optuna_sweep(tmp_path, 6, {"batch": "choice(32, 64)", "optimizer.lr": "choice(0.01, 0.001)"}, n_jobs)
    configurations = [overrides for _, overrides in launched]
    assert len(configurations) == len(set(configurations)) <= 4, configurations
    study = optuna.load_study(study_name="s", storage=open_storage(str(tmp_path / JOURNAL_FILE)))
    trials = {trial.number: trial for trial in study.trials}
    assert len(trials) == 6 and all(trial.state == optuna.trial.TrialState.COMPLETE for trial in trials.values())
    repeats = [trial for trial in trials.values() if DUPLICATE_ATTR in trial.user_attrs]
    assert len(repeats) == 6 - len(launched)
    for trial in repeats:
        original = trials[trial.user_attrs[DUPLICATE_ATTR]]
        assert original.params == trial.params and original.value == trial.value
        assert DUPLICATE_ATTR not in original.user_attrs
        assert (
            f"trial {trial.number}: the sampler proposed trial {original.number}'s configuration again" in caplog.text
        )


def test_the_same_configuration_seed_and_fold_twice_is_one_replicate_not_two():
    """Two finished runs of one configuration with the same seed (a configuration trained twice, as a re-run with a
    repeated sampler used to do): n is 1, the interval is none and nothing is compared on it twice."""
    twice = [_row(0, "lr=0.01", 0.8383), _row(2, "lr=0.01", 0.8383)]
    twice = [JobRow(**{**vars(row), "seed": "42"}) for row in twice]
    other = JobRow(**{**vars(_row(1, "lr=0.1", 0.7)), "seed": "42"})
    configurations = [ConfigurationRow("lr=0.01", twice), ConfigurationRow("lr=0.1", [other])]
    row = configurations[0]
    assert row.n == 1 and row.finished == [twice[0]] and row.repeated == [twice[1]] and row.replicate_count == 1
    assert row.values("test_accuracy") == [0.8383] and row.interval("test_accuracy").bounds is None
    summary = Summary("sweep", "p", "test_accuracy", [*twice, other], twice[0], configurations, row)
    markdown = summary.markdown()
    assert "| lr=0.01 | 1 |" in markdown and "1 repeated: job 2 (lr=0.01)" in markdown


def test_the_wilcoxon_pruner_stops_a_trial_whose_replicates_are_behind_the_best_ones_on_the_same_replicates(
    tmp_path, monkeypatch
):
    """pruner=wilcoxon in a 5-fold sweep: a job reports each fold's objective as the step of its replicate; a trial
    whose folds are all behind the best trial's same folds is pruned once Wilcoxon's one-sided test can say so
    (four pairs: p = 1/16 < 0.1), not before; one that keeps up is not. The training reports nothing per epoch."""
    from optuna.trial import TrialState

    from runner.sweeps.study.pruning import report_replicate, trial_reporter

    config = _grid_config("pruner=wilcoxon", "sweep.folds=5", "epochs=3")
    sweep = SweepConfig.read(config)
    assert sweep.prunes_replicates and not SweepConfig.read(_grid_config("pruner=median")).prunes_replicates
    check_sweep(config, sweep)
    create_grid_study(sweep, str(tmp_path))
    best = JobTrial(str(tmp_path), 0)
    link = best.open()
    for fold, value in enumerate((0.91, 0.88, 0.9, 0.87, 0.89)):
        assert not report_replicate(link, sweep, fold, value)  # the first trial: nothing to compare with
    best.tell(0.89)

    behind = JobTrial(str(tmp_path), 1).open()
    pruned_after = [fold for fold in range(5) if report_replicate(behind, sweep, fold, 0.5 + fold / 100)]
    assert pruned_after[0] == 3  # the fourth fold
    _, trial = behind.open()
    assert trial.user_attrs[PRUNED_TAG] == 3  # its runs stopped after their last epoch

    level = JobTrial(str(tmp_path), 2).open()
    assert not any(report_replicate(level, sweep, fold, value) for fold, value in enumerate((0.9, 0.89, 0.9, 0.88)))
    study = optuna.load_study(study_name=GRID_STUDY, storage=open_storage(str(tmp_path / JOURNAL_FILE)))
    assert study.trials[0].state == TrialState.COMPLETE and study.trials[1].intermediate_values[3] == 0.53

    for key, value in behind.to_environment().items():
        monkeypatch.setenv(key, value)
    assert trial_reporter(config, chief=True) is None  # no per-epoch reports: the steps are replicates

"""hydra.sweeper.terminate=regret (runner.sweeps.study.terminator) on real Optuna studies of made-up trials: the
noise is the best trial's standard error over its replicates as scipy computes it (s/√n over seeds, Nadeau and Bengio's
corrected variance over folds); the bound's width factor is Optuna's own; a study whose configurations all score
the same stops once it may, one whose scores still climb steeply does not; a repeated configuration and a trial
without replicates add nothing."""

from __future__ import annotations

import math
import statistics

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.terminator.improvement.evaluator import _get_beta
from scipy import stats

from runner.config.settings import optuna_sweeper_settings
from runner.errors import RunnerError
from runner.sweeps.study.study import DUPLICATE_ATTR, REPLICATES_ATTR
from runner.sweeps.study.terminator import RegretBound, ReplicateNoise, StudyTerminator, beta, study_terminator

SPACE = {
    "optimizer.lr": FloatDistribution(1e-4, 1e-1, log=True),
    "batch": CategoricalDistribution([32, 64, 128]),
}


def _study(points: list[tuple], direction: str = "maximize") -> optuna.Study:
    """A study of COMPLETE trials: each (lr, batch, its replicates' objectives[, further user attributes]), valued
    at the mean of its replicates."""
    study = optuna.create_study(direction=direction, storage=optuna.storages.InMemoryStorage())
    for lr, batch, replicates, *attrs in points:
        study.add_trial(
            optuna.trial.create_trial(
                params={"optimizer.lr": lr, "batch": batch},
                distributions=SPACE,
                value=statistics.fmean(replicates),
                user_attrs={REPLICATES_ATTR: replicates, **(attrs[0] if attrs else {})},
            )
        )
    return study


@pytest.mark.parametrize(("n_params", "n_trials"), [(1, 2), (2, 5), (3, 20)])
def test_the_bounds_width_factor_is_optunas(n_params, n_trials):
    assert beta(n_params, n_trials) == pytest.approx(_get_beta(n_params, n_trials), rel=1e-12)


def test_the_noise_is_the_best_trials_standard_error_over_seeds_or_corrected_over_folds():
    best = [0.90, 0.86, 0.88]
    study = _study([(0.01, 64, best), (0.001, 32, [0.70, 0.74, 0.71])])
    trials = study.get_trials(deepcopy=False)
    assert ReplicateNoise().evaluate(trials, study.direction) == pytest.approx(stats.sem(best), rel=1e-12)
    folds = 3  # Nadeau and Bengio: (1/J + n_test/n_train)·s², n_test/n_train = 1/(K-1)
    corrected = math.sqrt((1 / 3 + 1 / (folds - 1)) * statistics.variance(best))
    assert ReplicateNoise(folds).evaluate(trials, study.direction) == pytest.approx(corrected, rel=1e-12)
    lowest = _study([(0.01, 64, best), (0.001, 32, [0.70, 0.74, 0.71])], direction="minimize")
    assert ReplicateNoise().evaluate(lowest.trials, lowest.direction) == pytest.approx(stats.sem([0.70, 0.74, 0.71]))


def test_a_best_trial_without_replicates_never_stops_the_study():
    study = _study([(0.01, 64, [0.9]), (0.001, 32, [0.5, 0.6])])
    assert ReplicateNoise().evaluate(study.trials, study.direction) == -math.inf


def _terminator(min_trials: int = 4) -> StudyTerminator:
    return StudyTerminator(min_trials, RegretBound(seed=0), ReplicateNoise())


def test_a_study_whose_configurations_score_alike_stops_once_it_may_and_says_why():
    """Every configuration scores within a hair of the others, far inside the seeds' noise: nothing left to find."""
    flat = [(lr, batch, [0.80 + 1e-5 * k, 0.84, 0.82]) for k, (lr, batch) in enumerate(
        [(0.01, 64), (0.001, 32), (0.05, 128), (0.0003, 64), (0.002, 128)]
    )]  # fmt: skip
    assert _terminator(min_trials=6).reason_to_stop(_study(flat)) is None  # not before min_trials
    reason = _terminator(min_trials=5).reason_to_stop(_study(flat))
    assert reason is not None and reason.startswith("the study stopped after 5 completed trials")
    best = flat[-1][2]  # the highest mean, by 1e-5
    assert "regret bound" in reason and f"(standard error {stats.sem(best):.4g})" in reason


def test_a_study_still_climbing_steeply_with_little_noise_goes_on():
    """The objective rises by 0.1 per decade of learning rate, and the seeds agree to 0.001: the best could be far
    from the best configuration still."""
    climbing = [
        (lr, batch, [0.5 + 0.1 * math.log10(lr / 1e-4) + d for d in (0.0, 0.001)])
        for lr, batch in [(1e-4, 32), (3e-4, 64), (1e-3, 128), (3e-3, 32), (1e-2, 64)]
    ]
    study = _study(climbing)
    room = RegretBound(seed=0).evaluate(study.trials, study.direction)
    assert room > ReplicateNoise().evaluate(study.trials, study.direction)
    assert _terminator(min_trials=5).reason_to_stop(study) is None


def test_a_repeated_configuration_adds_no_evidence():
    """Trials the sampler proposed again (told their original's result, never trained) do not count towards
    min_trials."""
    original = (0.01, 64, [0.80, 0.84])
    repeats = [(*original, {DUPLICATE_ATTR: 0})] * 2
    assert _terminator(min_trials=3).reason_to_stop(_study([original, *repeats, (0.001, 32, [0.79, 0.83])])) is None
    # The same study with a third configuration trained instead of the repeats may stop.
    trained = _study([original, (0.002, 32, [0.80, 0.84]), (0.001, 32, [0.79, 0.83])])
    assert _terminator(min_trials=3).reason_to_stop(trained) is not None


@pytest.mark.parametrize(
    ("terminate", "min_trials", "paragraph"),
    [
        ("regrets", 5, "hydra.sweeper.terminate='regrets' is not valid: the study terminators are regret"),
        ("regret", 1, "hydra.sweeper.terminate_min_trials=1 is not valid"),
        ("regret", "5", "hydra.sweeper.terminate_min_trials='5' is not valid"),
    ],
)
def test_a_terminator_setting_that_cannot_work_is_one_paragraph(terminate, min_trials, paragraph):
    node = {"terminate": terminate, "terminate_min_trials": min_trials}
    with pytest.raises(RunnerError, match="Fix: ") as refused:
        optuna_sweeper_settings(node)
    assert str(refused.value).startswith(paragraph)
    assert study_terminator(None, 5, None, 0) is None


def test_the_terminator_stands_on_optunas_public_api_and_the_sweep_side_imports_without_a_future_warning():
    """optuna.terminator is deprecated since Optuna 4.9 (removed in 6.0): the regret terminator does not import it,
    and importing the sweep side's modules raises no FutureWarning (turned into an error here)."""
    import subprocess
    import sys

    modules = "runner.sweeps.study.terminator, runner.sweeps.plugins.optuna_sweeper, runner.sweeps.plugins.lifecycle"
    code = f"import {modules}; import sys; sys.exit('optuna.terminator' in sys.modules)"
    done = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:] or "optuna.terminator was imported"

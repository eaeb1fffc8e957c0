"""Fixtures and pytest hooks only: the plain functions and run presets the tests share are in tests/helpers/."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.config import compose
from helpers.presets import TINY
from helpers.requires import missing, on_ci
from helpers.turns import clear, turn
from runner.entry import prepare_for_tensorflow

prepare_for_tensorflow()  # the tests train in this process: tf_keras, before anything imports TensorFlow


@pytest.fixture
def tracking_uri(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def train(tmp_path, tracking_uri):
    """Train in this process with the given overrides (single-process strategies on one device)."""
    from omegaconf import OmegaConf

    from runner.config.settings import validate
    from runner.tracking.opening import opened_tracker
    from runner.train import run

    def _train(*overrides: str, run_dir: Path | None = None):
        args = [*TINY, f"mlflow.tracking_uri={tracking_uri}", *overrides]
        settings = validate(OmegaConf.to_container(compose(args), resolve=True))
        with opened_tracker(settings.mlflow, tracks=True, in_process=True) as tracker:
            return run(settings, str(run_dir or tmp_path / "run"), tracker, args)

    return _train


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """@requires(...): skip a test whose tools are missing here, naming what to install, before any of its
    fixtures starts a server; under CI=true fail it instead (CI installs them all)."""
    for marker in item.iter_markers("requires"):
        reasons = missing(marker.args)
        if reasons:
            if on_ci():
                pytest.fail("CI=true, and " + "; ".join(reasons), pytrace=False)
            pytest.skip("; ".join(reasons))


def pytest_addoption(parser):
    parser.addoption(
        "--soak", action="store_true", default=False, help="also collect the soak tests (@pytest.mark.soak)"
    )


# Modules that start a SLURM cluster of their own (tests/helpers/slurm.py): one at a time on the machine.
SLURM_MODULES = {"test_slurm", "test_preemption_clusters", "test_submitit"}

# The longest groups first (each group's seconds summed from --durations=0 of a whole run on 2 cores): the workers
# take them first, so that what is left for the end is short and neither worker waits long on the other. Beside the
# SLURM group, which mostly waits on SLURM's clocks, come the long groups with no test that must run alone
# (@pytest.mark.alone, or helpers.turns.alone_now): such a test waits for the test beside it to end, and beside a
# SLURM test both workers then idle (test_optuna_sweeps' frozen orphan waited up to 240 s so). The order is only a
# schedule; any order passes.
LONGEST_GROUPS = (
    "slurm",  # about 1080 s; beside it, about 1060 s of groups that never run alone:
    "test_sweep_validation",  # 300 s
    "test_example_project",  # 360 s
    "test_warm_workers",  # 210 s
    "test_training",  # 190 s
    # Then the longest of the rest.
    "test_optuna_sweeps",  # 580 s
    "test_resilience",  # 550 s
    "test_sweep",  # 300 s
    "test_outage",  # 220 s
    "test_team_server_page",  # 180 s
    "test_cluster",  # 180 s
    "test_determinism",  # 165 s
    "test_packaging",  # 160 s
    "test_sweep_seeds",  # 155 s
    "test_keras3",  # 125 s
    "test_ray_sweep",  # 110 s
    "test_model_logging",  # 95 s
)


def group_of(nodeid: str) -> str:
    """The group a test runs in: its module's name ("slurm" for the SLURM modules, which share one)."""
    module = Path(nodeid.split("::")[0]).stem
    return "slurm" if module in SLURM_MODULES else module


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (pyproject.toml's addopts: -n 2 --dist loadscope) each group is one unit that one worker
    runs in order, so that its module-scoped fixtures (a sweep, a cluster, a server) start once and the SLURM modules
    never run at once. xdist's own `loadgroup` cannot do this under pytest 9.2: it renames a test's nodeid through a
    private attribute that pytest no longer reads, and every test was scheduled alone."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ModuleGroups(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Soak tests run for many minutes: without --soak they are deselected, not skipped (a skipped test fails CI).
    The longest groups come first (LONGEST_GROUPS, with --no-loadscope-reorder in pyproject.toml, which would
    otherwise put the groups of most tests first), each group's tests together and in their order."""

    def rank(item) -> int:
        group = group_of(item.nodeid)
        return LONGEST_GROUPS.index(group) if group in LONGEST_GROUPS else len(LONGEST_GROUPS)

    items.sort(key=rank)  # stable: within a group, and among the rest, the order of collection
    if config.getoption("--soak"):
        return
    soak = [item for item in items if item.get_closest_marker("soak") is not None]
    if soak:
        config.hook.pytest_deselected(items=soak)
        items[:] = [item for item in items if item.get_closest_marker("soak") is None]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """@pytest.mark.alone: the test runs while no other test runs (tests/helpers/turns.py); every other test runs
    beside at most one more. Outermost (tryfirst), so that pytest-timeout's clock starts once the test has its
    turn, not while it waits for it."""
    with turn(alone=item.get_closest_marker("alone") is not None):
        yield


def pytest_sessionfinish(session, exitstatus):
    clear()  # the turns' lock files of a worker that is done

"""What the runner's Optuna sweeper costs per trial on its own, as a study grows to thousands of trials: the sweep's
loop (runner.sweeps.plugins.optuna_sweeper.OptunaSweep, one slot) with Hydra's launch replaced by a stand-in that
returns at once, in a journal file (the default storage) and in a real PostgreSQL (tests/helpers/servers.py's throwaway
cluster, the `hydra.sweeper.storage=postgresql+psycopg2://...` a team would give). Per trial:

- ask: the sweeper's next trial (_Progress.next_trial: the study's count of started trials, study.ask with the
  search space, the trial's sweep_dir attribute);
- record: the stand-in job's MLflow child run (created with the job's tags, its metrics logged at epoch 1, ended),
  in a sqlite store as a sweep's default;
- tell: the sweeper's tell (_Progress.tell: the trial read back for a pruned mark, study.tell);
- summary: runner.sweeps.report.summary.collect over the parent's children, and both tables, divided by the rows;
- job open: what each job's training process pays once to reach its trial (TrialLink.open: the study loaded from
  the storage, a journal replayed from its first line), measured with the study at its full size.

No TensorFlow and no training: only the bookkeeping that grows with the study. The sampler is Optuna's
RandomSampler unless --sampler tpe (TPE's own cost grows with the completed trials it models).

    python -m bench.sweeper_bookkeeping --trials 10 100 1000 2000 --storage journal postgresql \
        --json docs/performance-sweeper-bookkeeping.json
    python -m bench.sweeper_bookkeeping --trials 10 --storage journal     # a quick look
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLUMNS = (
    "storage",
    "trials",
    "ask_ms",
    "record_ms",
    "tell_ms",
    "summary_ms_per_row",
    "total_ms_per_trial",
    "ask_tell_ms_last_tenth",
    "job_open_ms",
    "wall_s",
)
SPACE = {"optimizer.lr": "tag(log, interval(1e-5, 1e-1))", "batch": "choice(32, 64, 128)"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.sweeper_bookkeeping", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[10, 100, 1000, 2000])
    parser.add_argument("--storage", nargs="+", choices=("journal", "postgresql"), default=["journal", "postgresql"])
    parser.add_argument("--sampler", choices=("random", "tpe"), default="random")
    parser.add_argument("--json", default=None, help="write the rows here")
    return parser.parse_args(argv)


class _Timer:
    """Seconds spent in each wrapped function, and in each of its calls (in order)."""

    def __init__(self) -> None:
        self.calls: dict[str, list[float]] = {}

    def wrap(self, name: str, function: Callable) -> Callable:
        calls = self.calls.setdefault(name, [])

        @functools.wraps(function)
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                calls.append(time.perf_counter() - started)

        return timed

    def total(self, name: str) -> float:
        return sum(self.calls.get(name, []))


class StandInLauncher:
    """Hydra's launcher as the sweeper calls it, but each job is only its MLflow child run, recorded as a sweep job
    records a finished one (tags, its metrics at epoch 1, FINISHED), and its objective returned at once."""

    def __init__(self, client, parent, timer: _Timer):
        self.client, self.parent = client, parent
        self.record = timer.wrap("record", self._record)

    def launch(self, job_overrides, initial_job_idx: int):
        from hydra.core.utils import JobReturn, JobStatus

        returns = []
        for offset, overrides in enumerate(job_overrides):
            value = self.record(initial_job_idx + offset, list(overrides))
            returns.append(JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED, _return_value=value))
        return returns

    def _record(self, number: int, overrides: list[str]) -> float:
        from mlflow.entities import Metric, RunStatus
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        from runner.sweeps.terms import CONFIGURATION_TAG, JOB_NUMBER_TAG, OVERRIDES_TAG, SEED_TAG

        name = ",".join(overrides)
        run = self.client.create_run(
            self.parent.info.experiment_id,
            run_name=name,
            tags={
                MLFLOW_PARENT_RUN_ID: self.parent.info.run_id,
                JOB_NUMBER_TAG: str(number),
                OVERRIDES_TAG: name,
                CONFIGURATION_TAG: name,
                SEED_TAG: "42",
            },
        )
        value = (number * 7919 % 1000) / 1000  # any objective in [0, 1): the sampler is not what is measured
        now = int(time.time() * 1000)
        metrics = {"train_loss": 1 - value, "train_accuracy": value, "test_loss": 1 - value, "test_accuracy": value}
        self.client.log_batch(run.info.run_id, metrics=[Metric(key, metric, now, 1) for key, metric in metrics.items()])
        self.client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.FINISHED))
        return value


@contextmanager
def _timed_progress(timer: _Timer) -> Iterator[None]:
    """The sweeper's ask and tell (runner.sweeps.plugins.optuna_sweeper._Progress), timed while the study runs."""
    from runner.sweeps.plugins import optuna_sweeper

    progress = optuna_sweeper._Progress
    originals = progress.next_trial, progress.tell
    progress.next_trial = timer.wrap("ask", progress.next_trial)  # type: ignore[method-assign]
    progress.tell = timer.wrap("tell", progress.tell)  # type: ignore[method-assign]
    try:
        yield
    finally:
        progress.next_trial, progress.tell = originals  # type: ignore[method-assign]


def measure(storage_name: str, storage_url: str | None, trials: int, sampler: str) -> dict:
    """One study of `trials` trials through the sweeper, in a fresh sweep directory and MLflow store."""
    from mlflow.tracking import MlflowClient
    from omegaconf import OmegaConf

    from runner.config.check import compose_config
    from runner.sweeps.plugins.optuna_sweeper import OptunaSweep
    from runner.sweeps.report import summary as sweep_summary
    from runner.sweeps.study.study import TrialLink
    from runner.sweeps.sweep_config import SweepConfig
    from runner.sweeps.terms import PARENT_RUN_ID_FILE, SWEEP_DIR_TAG

    workdir = Path(tempfile.mkdtemp(prefix="bench-bookkeeping-"))
    try:
        sweep_dir = workdir / "sweep"
        sweep_dir.mkdir()
        client = MlflowClient(tracking_uri=f"sqlite:///{workdir}/mlflow.db")
        experiment_id = client.create_experiment("bookkeeping")
        parent = client.create_run(experiment_id, run_name="sweep", tags={SWEEP_DIR_TAG: str(sweep_dir)})
        (sweep_dir / PARENT_RUN_ID_FILE).write_text(parent.info.run_id + "\n")
        timer = _Timer()
        # The sweep's composed config with its `hydra` node, as Hydra hands it to the sweeper.
        config = compose_config(["hparams_search=optuna"], return_hydra_config=True)
        sampler_class = "TPESampler" if sampler == "tpe" else "RandomSampler"
        sweeper = {
            "direction": "maximize",
            "n_trials": trials,
            "n_jobs": 1,
            "storage": storage_url,
            "study_name": f"bookkeeping-{trials}",
            "sampler": {"_target_": f"optuna.samplers.{sampler_class}", "seed": 0},
            "enqueue": [],
            "params": SPACE,
        }
        for key, value in sweeper.items():
            OmegaConf.update(config, f"hydra.sweeper.{key}", value, merge=False)
        OmegaConf.update(config, "hydra.sweep.dir", str(sweep_dir))
        study = SweepConfig.read(config).study
        assert study is not None
        started = time.perf_counter()
        with _timed_progress(timer):
            returns = OptunaSweep(config, StandInLauncher(client, parent, timer)).run([])
        assert len(returns) == trials
        summary_started = time.perf_counter()
        summary = sweep_summary.collect(client, parent.info.run_id, "test_accuracy", lower_is_better=False)
        summary.markdown(), summary.jobs_markdown()
        summary_seconds = time.perf_counter() - summary_started
        wall = time.perf_counter() - started
        assert len(summary.rows) == trials
        link = TrialLink(study.storage, study.name, trials - 1)
        opens = []
        for _ in range(3):
            opened = time.perf_counter()
            link.open()
            opens.append(time.perf_counter() - opened)
        asks, tells = timer.calls["ask"], timer.calls["tell"]
        tenth = max(1, trials // 10)
        return {
            "storage": storage_name,
            "trials": trials,
            # The last ask finds the study full and returns None: not a trial's.
            "ask_ms": 1000 * sum(asks[:trials]) / trials,
            "record_ms": 1000 * timer.total("record") / trials,
            "tell_ms": 1000 * sum(tells) / trials,
            "summary_ms_per_row": 1000 * summary_seconds / trials,
            "total_ms_per_trial": 1000 * wall / trials,
            "ask_tell_ms_last_tenth": 1000 * (sum(asks[trials - tenth : trials]) + sum(tells[-tenth:])) / tenth,
            "job_open_ms": 1000 * statistics.median(opens),
            "wall_s": wall,
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def _postgres() -> Iterator[Callable[[str], str]]:
    """tests/helpers/servers.py's PostgreSQL (initdb and pg_ctl in a temp directory, a free loopback port), one
    database per study; yields a function from a database name to its URL."""
    sys.path.insert(0, str(REPO / "tests"))
    from helpers.servers import Postgres  # the suite's own throwaway cluster, not a second copy of it

    log = Path(tempfile.mkdtemp(prefix="bench-postgres-")) / "postgres.log"
    server = Postgres(log_copy=log).start()
    try:
        yield server.create_database
    finally:
        server.stop()


def table(rows: list[dict]) -> str:
    lines = [
        "| storage | trials | ask ms | record ms | tell ms | summary ms/row | total ms/trial | "
        "ask+tell ms, last tenth | job opens its trial ms | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['storage']} | {row['trials']} | {row['ask_ms']:.1f} | {row['record_ms']:.1f} | "
            f"{row['tell_ms']:.1f} | {row['summary_ms_per_row']:.1f} | {row['total_ms_per_trial']:.1f} | "
            f"{row['ask_tell_ms_last_tenth']:.1f} | {row['job_open_ms']:.0f} | {row['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    import logging

    import optuna

    args = parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # The sweeper's per-study lines would drown the table; put back afterwards (the test calls main in-process).
    runner_log = logging.getLogger("runner")
    level = runner_log.level
    runner_log.setLevel(logging.WARNING)
    try:
        _measure_all(args)
    finally:
        runner_log.setLevel(level)


def _measure_all(args: argparse.Namespace) -> None:
    rows: list[dict] = []

    def run_sizes(name: str, url_for: Callable[[int], str | None]) -> None:
        for trials in args.trials:
            rows.append(measure(name, url_for(trials), trials, args.sampler))
            print(table(rows[-1:]).splitlines()[-1], flush=True)

    # Imports, MLflow's first store and the sampler's first call: paid once, before any measured study.
    measure("warm-up", None, 5, args.sampler)
    print(table([]), flush=True)
    if "journal" in args.storage:
        run_sizes("journal file", lambda trials: None)
    if "postgresql" in args.storage:
        with _postgres() as create_database:
            run_sizes("PostgreSQL", lambda trials: create_database(f"optuna_{trials}"))
    print()
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

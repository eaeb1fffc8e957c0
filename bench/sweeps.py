"""What pruning and free slots buy an Optuna study: the same study (search space, sampler seed, trials) with
`pruner=none` and `pruner=median`, serial and on two joblib slots, each a real `python -m runner hparams_search=optuna`
sweep in a fresh directory. Read back from its MLflow runs and its study:

- epochs trained in all, the study's wall time and its best objective;
- idle slot time: slots x wall time minus the time the trials' runs were open, over slots x wall time;
- each trial's fixed cost: process start to first step (the runner logs it) and last epoch to the run's end.

    python -m bench.sweeps --trials 16 --epochs 4 --json docs/performance-sweeps-full.json
    python -m bench.sweeps --trials 4 --epochs 2 --train-examples 2000    # a quick look
    python -m bench.sweeps --studies "successive_halving, serial" --json docs/performance-sweeps-sha.json
    python -m bench.sweeps --seed 1 2 3 --studies "none, serial" "median, serial"    # the spread over sampler seeds
    python -m bench.sweeps --replicates --folds 5 --seed 1 2 3 4 5 --trials 6 --epochs 1 --train-examples 1000 \
        --json docs/performance-sweeps-replicates.json    # pruning and stopping on folds, over 5 sampler seeds

With several seeds, every study runs once per seed, and a last table sets each pruned study against the unpruned
study of the same seed and slots: its epochs as a fraction of the unpruned study's, and its best objective's
difference.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.report import markdown

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data" / "fashion-mnist"
# (name, overrides): the four studies, in the order they run.
STUDIES = (
    ("none, serial", ["pruner=none"]),
    ("median, serial", ["pruner=median"]),
    ("none, 2 slots", ["pruner=none", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]),
    ("median, 2 slots", ["pruner=median", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]),
    # Not run by default: asynchronous successive halving (keeps the best quarter at each rung).
    ("successive_halving, serial", ["pruner=successive_halving"]),
    # Not run by default (--replicates): configurations over --folds folds, unpruned, pruned on their folds by
    # Wilcoxon's signed-rank test against the best (pruner=wilcoxon, from the 4th fold on), and ended by the
    # regret-bound terminator (hydra.sweeper.terminate).
    ("none, folds", ["pruner=none"]),
    ("wilcoxon, folds", ["pruner=wilcoxon"]),
    ("regret, folds", ["pruner=none", "hydra.sweeper.terminate=regret"]),
)
REPLICATE_STUDIES = [name for name, _ in STUDIES if name.endswith(", folds")]
DEFAULT_STUDIES = [name for name, _ in STUDIES[:4]]
FIRST_STEP = re.compile(r"first training step done, ([0-9.]+) s after the (?:process started|warm worker took the run)")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.sweeps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--train-examples", type=int, default=None, help="a subset of Fashion-MNIST (default: all)")
    parser.add_argument(
        "--seed", type=int, nargs="+", default=[42], help="the sampler's seed(s): every study runs once per seed"
    )
    parser.add_argument("--startup-trials", type=int, default=4, help="complete trials before the median pruner prunes")
    parser.add_argument("--data", default=str(SHARED_DATA))
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument(
        "--studies", nargs="+", default=DEFAULT_STUDIES, choices=[name for name, _ in STUDIES], metavar="STUDY"
    )
    parser.add_argument("--folds", type=int, default=5, help="with --replicates: sweep.folds")
    parser.add_argument(
        "--replicates", action="store_true", help=f"run the studies over folds instead: {', '.join(REPLICATE_STUDIES)}"
    )
    args = parser.parse_args(argv)
    if args.replicates:
        args.studies = REPLICATE_STUDIES
    return args


def command(args: argparse.Namespace, workdir: Path, extra: list[str], seed: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "runner",
        "hparams_search=optuna",
        f"hydra.sweeper.n_trials={args.trials}",
        f"hydra.sweeper.sampler.seed={seed}",
        "optimizer.lr=tag(log, interval(1e-5, 1e-1))",
        "batch=choice(32, 64, 128)",
        *([f"pruner.n_startup_trials={args.startup_trials}"] if "pruner=median" in extra else []),
        f"epochs={args.epochs}",
        "strategy=one_device",
        "progress=false",
        "mlflow.log_model=false",
        f"dataset.dir={args.data}",
        *([f"dataset.train_examples={args.train_examples}"] if args.train_examples else []),
        f"mlflow.tracking_uri=sqlite:///{workdir}/mlflow.db",
        f"hydra.sweep.dir={workdir}/sweep",
        *([f"sweep.folds={args.folds}"] if args.replicates else []),
        *extra,
    ]


def measure(args: argparse.Namespace, name: str, extra: list[str], seed: int) -> dict:
    from mlflow.tracking import MlflowClient

    workdir = Path(tempfile.mkdtemp(prefix="bench-sweeps-"))
    started = time.monotonic()
    done = subprocess.run(command(args, workdir, extra, seed), cwd=workdir, capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{name}: the sweep failed:\n{done.stderr[-3000:]}")
    client = MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
    if args.replicates:
        return _replicate_row(client, runs, name, seed, wall)
    trials = [run for run in runs if "job_number" in run.data.tags]
    epochs = sum(len(client.get_metric_history(run.info.run_id, "test_accuracy")) for run in trials)
    open_seconds = sum((run.info.end_time - run.info.start_time) / 1000 for run in trials)
    slots = 2 if "hydra.launcher.n_jobs=2" in extra else 1
    tails = []
    for run in trials:
        last_epoch = max(point.timestamp for point in client.get_metric_history(run.info.run_id, "test_accuracy"))
        tails.append((run.info.end_time - last_epoch) / 1000)
    first_steps = [
        float(match.group(1))
        for log in (workdir / "sweep").glob("*/runner.log")
        for match in [FIRST_STEP.search(log.read_text())]
        if match
    ]
    finished = [run for run in trials if "pruned_at_epoch" not in run.data.tags]
    best = max(finished, key=lambda run: run.data.metrics["val_accuracy"])
    return {
        "study": name,
        "seed": seed,
        "trials": len(trials),
        "pruned": len(trials) - len(finished),
        "epochs": epochs,
        "wall_seconds": wall,
        # The sweep's objective (val_accuracy on the split the trials hold out) chooses the best trial; its
        # test_accuracy is reported once, beside it.
        "best_val_accuracy": best.data.metrics["val_accuracy"],
        "best_test_accuracy": best.data.metrics["test_accuracy"],
        "idle_fraction": max(0.0, 1 - open_seconds / (slots * wall)),
        "first_step_seconds": statistics.median(first_steps) if first_steps else None,
        "last_epoch_to_end_seconds": statistics.median(tails),
    }


def _replicate_row(client, runs: list, name: str, seed: int, wall: float) -> dict:
    """A study over folds: its configurations (one trial each, a child run per fold), those pruned, the epochs its
    fold runs trained, whether its terminator ended it, and its best configuration's mean val_accuracy over folds
    (what chose it) with the mean test_accuracy of the same runs."""
    children = [run for run in runs if "job_number" in run.data.tags]
    [parent] = [run for run in runs if "job_number" not in run.data.tags]
    jobs: dict[str, list] = {}
    for run in children:
        jobs.setdefault(run.data.tags["job_number"], []).append(run)
    pruned = [job for job, folds in jobs.items() if any("pruned_at_epoch" in run.data.tags for run in folds)]
    best = parent.data.tags["best_configuration"]
    chosen = [run for run in children if run.data.tags.get("configuration") == best and run.info.status == "FINISHED"]
    return {
        "study": name,
        "seed": seed,
        "trials": len(jobs),
        "pruned": len(pruned),
        "epochs": sum(len(client.get_metric_history(run.info.run_id, "test_accuracy")) for run in children),
        "fold_runs": len(children),
        "wall_seconds": wall,
        "stopped_early": bool(parent.data.tags.get("study_stopped_early")),
        "best_val_accuracy": parent.data.metrics["best_val_accuracy_mean"],
        "best_test_accuracy": statistics.mean(run.data.metrics["test_accuracy"] for run in chosen),
    }


def replicate_table(rows: list[dict]) -> str:
    header = ["study", "trials (pruned)", "fold runs", "epochs trained", "stopped early", "wall s"]
    header.append("best mean val_accuracy (its mean test_accuracy)")
    cells = [
        [
            f"{row['study']}{_seed(row)}",
            f"{row['trials']} ({row['pruned']})",
            str(row["fold_runs"]),
            str(row["epochs"]),
            "yes" if row["stopped_early"] else "no",
            f"{row['wall_seconds']:.0f}",
            f"{row['best_val_accuracy']:.4f} ({row['best_test_accuracy']:.4f})",
        ]
        for row in rows
    ]
    return markdown(header, "lrrrlrr", cells)


def table(rows: list[dict]) -> str:
    header = ["study", "trials (pruned)", "epochs trained", "wall s", "best val_accuracy (its test_accuracy)"]
    header += ["idle slot time", "start to first step s", "last epoch to end s"]
    cells = [
        [
            f"{row['study']}{_seed(row)}",
            f"{row['trials']} ({row['pruned']})",
            str(row["epochs"]),
            f"{row['wall_seconds']:.0f}",
            f"{row['best_val_accuracy']:.4f} ({row['best_test_accuracy']:.4f})",
            f"{row['idle_fraction']:.1%}",
            f"{row['first_step_seconds']:.1f}",
            f"{row['last_epoch_to_end_seconds']:.1f}",
        ]
        for row in rows
    ]
    return markdown(header, "lrrrrrrr", cells)


def _seed(row: dict) -> str:
    return f", seed {row['seed']}" if "seed" in row else ""


def against_unpruned(rows: list[dict]) -> str:
    """Each pruned study set against the unpruned study ("none, ...") of the same seed and slots: its epochs as a
    fraction of the unpruned study's, and its best val_accuracy minus the unpruned study's."""

    def seed_and_slots(row: dict) -> tuple[int | None, str]:
        return row.get("seed"), row["study"].split(", ")[1]  # "median, 2 slots": "2 slots"

    unpruned = {seed_and_slots(row): row for row in rows if row["study"].startswith("none")}
    lines = [
        "| seed | study | trials pruned | epochs (x unpruned) | best val_accuracy (- unpruned) |",
        "|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        reference = unpruned.get(seed_and_slots(row))
        if row["study"].startswith("none") or reference is None:
            continue
        lines.append(
            f"| {row.get('seed')} | {row['study']} | {row['pruned']} of {row['trials']} | {row['epochs']} "
            f"({row['epochs'] / reference['epochs']:.2f}x) | {row['best_val_accuracy']:.4f} "
            f"({row['best_val_accuracy'] - reference['best_val_accuracy']:+.4f}) |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    rows = []
    show = replicate_table if args.replicates else table
    for seed in args.seed:
        for name, extra in [study for study in STUDIES if study[0] in args.studies]:
            rows.append(measure(args, name, extra, seed))
            print(show(rows[-1:]).splitlines()[-1], flush=True)
            if args.json:  # after each study, so that a long measurement keeps what it has
                Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")
    print(show(rows))
    if len(args.seed) > 1 or len(args.studies) > 1:
        print(against_unpruned(rows))


if __name__ == "__main__":
    main()

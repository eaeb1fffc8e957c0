"""What a runner sweep costs against an in-process Optuna study: the runner's `hparams_search=optuna` sweep of N
one-epoch trials with warm workers ("warm", sweep.warm_workers=true), with warm workers where only the sweep's
champion logs its model ("champion", sweep.trial_models=champion: the others skip the export) and with a fresh
process per trial ("cold", sweep.warm_workers=false), against the same study run in one Python process with
model.fit ("inprocess", bench/inprocess_study.py). Each is a whole process timed from the outside, in a fresh
directory with a fresh sqlite store, one after another. Read back from each runner sweep:

- every trial's phases, from its job's runner.log: start-up (the process, or the warm worker taking the run, to the
  MLflow run started: compose, tracker), first step, training (the epoch), evaluation (the restored model's),
  model export, run end; the median of each over the trials;
- the trial overhead beyond training and evaluation: (wall - the trials' training + evaluation) / N; and, steady,
  the median over trials 2..N of the gap between consecutive trials' start instants less the training + evaluation
  of the trial in that gap;
- its MLflow child runs: FINISHED, each with a logged model (the champion alone under "champion"), and the warm
  trials' metrics (val_accuracy, test_loss) identical to the cold trials' of the same job number.

    python -m bench.sweep_cost --trials 6 --json /tmp/sweep_cost_6.json --markdown /tmp/sweep_cost_6.md
    python -m bench.sweep_cost --trials 6 24 --repeats 3 --json docs/performance-sweep-cost.json
    python -m bench.sweep_cost --trials 4 --variants warm inprocess    # a quick look
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from bench.report import markdown
from bench.run import machine

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data" / "fashion-mnist"
VARIANTS = ("warm", "champion", "cold", "inprocess")
RUNNER_VARIANTS = ("warm", "champion", "cold")
EXPERIMENT = "fashion_mnist"
COMPARED_METRICS = ("val_accuracy", "test_loss")

# Hydra's log format: `[2026-01-31 12:00:00,123][runner][INFO] - message`.
LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[runner\]\[INFO\] - (.*)$")
FIRST_STEP = re.compile(
    r"^first training step done, ([0-9.]+) s after the (?:process started|warm worker took the run)"
)
# The instants of a trial, each the first line that matches (the epoch's: the last epoch's line, "epoch 4/4: ...").
MARKERS = {
    "run_started": re.compile(r"^MLflow run \S+ in experiment .* outputs in "),
    "first_step": FIRST_STEP,
    "epoch_end": re.compile(r"^epoch (\d+)/\1: "),
    "restored": re.compile(r"^restored .* eval_accuracy "),
    "model_logged": re.compile(r"^logged the model "),
    "done": re.compile(r"^done: "),
}
# (phase, from instant, to instant): a trial's phases, in order.
PHASES = (
    ("start-up: process or worker, compose, tracker", "start", "run_started"),
    ("first step", "run_started", "first_step"),
    ("training", "first_step", "epoch_end"),
    ("evaluation", "epoch_end", "restored"),
    ("model export", "restored", "model_logged"),
    ("run end", "model_logged", "done"),
)


@dataclasses.dataclass
class Sample:
    """One timed process: a runner sweep or the in-process study."""

    variant: str
    trials: int
    round: int
    wall_seconds: float
    returncode: int
    finished: int = 0  # child runs FINISHED
    with_model: int = 0  # child runs FINISHED with a logged model
    best_value: float | None = None
    # Runner sweeps: per job number, its instants (seconds since the epoch; None where its line is missing).
    instants: dict[str, dict[str, float | None]] = dataclasses.field(default_factory=dict)
    # Per job number (runner) or trial number (in-process): the compared metrics of its run.
    metrics: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    trial_seconds: list[float] = dataclasses.field(default_factory=list)  # in-process: each objective call
    # Warm sweeps: each warm worker's resident MiB, sampled every half second while the sweep ran, by pid.
    worker_mib: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    output_tail: str = ""  # a failed process's last 30 lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.sweep_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[6, 24], help="N: each is measured")
    parser.add_argument("--repeats", type=int, default=1, help="rounds; each runs the variants in a rotated order")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--data-dir", default=str(SHARED_DATA))
    parser.add_argument("--train-examples", type=int, default=3000)
    parser.add_argument("--test-examples", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=7200, help="seconds one process may take")
    parser.add_argument("--json", default=None, help="write the raw samples here (after each process)")
    parser.add_argument("--markdown", default=None, help="write the tables here")
    return parser.parse_args(argv)


def runner_command(args: argparse.Namespace, trials: int, variant: str) -> list[str]:
    """The runner's sweep for `variant`: warm (the defaults), champion (warm, sweep.trial_models=champion) or cold."""
    return [
        sys.executable,
        "-m",
        "runner",
        "hparams_search=optuna",
        f"hydra.sweeper.n_trials={trials}",
        "epochs=1",
        "strategy=one_device",
        f"dataset.dir={args.data_dir}",
        f"dataset.train_examples={args.train_examples}",
        f"dataset.test_examples={args.test_examples}",
        "hydra.sweep.dir=sweep",
        "progress=false",
        f"sweep.warm_workers={'false' if variant == 'cold' else 'true'}",
        f"sweep.trial_models={'champion' if variant == 'champion' else 'every'}",
    ]


def inprocess_command(args: argparse.Namespace, trials: int, workdir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.inprocess_study",
        "--trials",
        str(trials),
        "--data-dir",
        args.data_dir,
        "--train-examples",
        str(args.train_examples),
        "--test-examples",
        str(args.test_examples),
        "--tracking-uri",
        f"sqlite:///{workdir}/mlflow.db",
    ]


def run_timed(
    command: list[str], workdir: Path, env: dict[str, str], timeout: float, memory: dict[int, list[float]] | None = None
) -> tuple[float, int, str]:
    """(wall seconds, exit status, output): `command` run in `workdir`, its stdout and stderr in one file there;
    `memory` (if given) gets each warm worker's resident MiB, sampled every half second, by pid."""
    log = workdir / "output.txt"
    started = time.monotonic()
    with log.open("w") as handle:
        process = subprocess.Popen(command, cwd=workdir, env=env, stdout=handle, stderr=subprocess.STDOUT)
        deadline = started + timeout
        while process.poll() is None and time.monotonic() < deadline:
            if memory is not None:
                for pid, mib in warm_workers_mib().items():
                    memory.setdefault(pid, []).append(mib)
            time.sleep(0.5)
        if process.poll() is None:
            process.kill()
            process.wait()
            returncode = 124
        else:
            returncode = process.returncode
    return time.monotonic() - started, returncode, log.read_text(errors="replace")


def warm_workers_mib() -> dict[int, float]:
    """The resident MiB (VmRSS) of every warm training worker (python -m runner.warm_worker) now, by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"runner.warm_worker" not in (entry / "cmdline").read_bytes():
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    found[int(entry.name)] = int(line.split()[1]) / 1024
        except OSError:  # it ended meanwhile
            continue
    return found


def measure(args: argparse.Namespace, variant: str, trials: int, round_: int) -> Sample:
    """One process of `variant` in a fresh directory (removed afterwards unless the process failed)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-sweep-cost-{variant}-"))
    env = dict(os.environ)
    if variant == "inprocess":  # bench/ is no package of the venv: the study runs from the checkout
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        command = inprocess_command(args, trials, workdir)
    else:
        command = runner_command(args, trials, variant)
    memory: dict[int, list[float]] = {}
    wall, returncode, output = run_timed(command, workdir, env, args.timeout, memory)
    sample = Sample(variant, trials, round_, wall, returncode, worker_mib=memory)
    if returncode != 0:
        sample.output_tail = "\n".join(output.splitlines()[-30:])
        print(f"{variant} x{trials} failed ({returncode}), kept {workdir}:\n{sample.output_tail}", file=sys.stderr)
        return sample
    read_runs(sample, f"sqlite:///{workdir}/mlflow.db")
    if variant == "inprocess":
        result = json.loads(output.strip().splitlines()[-1])
        sample.best_value, sample.trial_seconds = result["best_value"], result["trial_seconds"]
    else:
        sample.instants = {log.parent.name: trial_instants(log) for log in (workdir / "sweep").glob("*/runner.log")}
    shutil.rmtree(workdir, ignore_errors=True)
    return sample


def trial_instants(log: Path) -> dict[str, float | None]:
    """A trial's instants from its runner.log: `start` (the process start, or the warm worker taking the run: the
    first step's line less the seconds it states) and each of MARKERS (None where its line is missing)."""
    instants: dict[str, float | None] = dict.fromkeys(["start", *MARKERS])
    for line in log.read_text(errors="replace").splitlines():
        match = LOG_LINE.match(line)
        if not match:
            continue
        at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        message = match.group(2)
        if instants["done"] is not None:  # a later invocation: the champion's continuation (sweep.trial_models)
            break
        for name, pattern in MARKERS.items():
            found = pattern.match(message)
            if found and instants[name] is None:
                instants[name] = at
                if name == "first_step":
                    instants["start"] = at - float(found.group(1))
    return instants


def read_runs(sample: Sample, tracking_uri: str) -> None:
    """The child runs of the store's one sweep or study: how many FINISHED, how many of those with a logged model,
    their compared metrics by job number (trial number in-process), and the best val_accuracy (runner sweeps)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        return
    runs = client.search_runs([experiment.experiment_id], max_results=10_000)
    children = [run for run in runs if "mlflow.parentRunId" in run.data.tags]
    models = client.search_logged_models(experiment_ids=[experiment.experiment_id], max_results=10_000)
    modelled = {model.source_run_id for model in models if str(model.status).endswith("READY")}
    finished = [run for run in children if run.info.status == "FINISHED"]
    sample.finished = len(finished)
    sample.with_model = sum(run.info.run_id in modelled for run in finished)
    for number, run in enumerate(sorted(children, key=lambda run: run.info.start_time)):
        job = run.data.tags.get("job_number", str(number))
        sample.metrics[job] = {name: run.data.metrics[name] for name in COMPARED_METRICS if name in run.data.metrics}
    scores = [run.data.metrics["val_accuracy"] for run in finished if "val_accuracy" in run.data.metrics]
    sample.best_value = max(scores, default=None)


def phases(instants: dict[str, float | None]) -> dict[str, float | None]:
    """A trial's phase durations (seconds; None where a line that bounds it is missing)."""
    durations: dict[str, float | None] = {}
    for phase, begin, end in PHASES:
        since, until = instants[begin], instants[end]
        if begin == "model_logged" and since is None:  # a trial that logs no model ends from its evaluation
            since = instants["restored"]
        durations[phase] = None if since is None or until is None else until - since
    return durations


def working(instants: dict[str, float | None]) -> float | None:
    """A trial's training + evaluation: its first step's line to its restored model's evaluation."""
    since, until = instants["first_step"], instants["restored"]
    return None if since is None or until is None else until - since


def overhead(sample: Sample) -> float | None:
    """(wall - the trials' training + evaluation) / N."""
    work = [working(instants) for instants in sample.instants.values()]
    if not work or None in work:
        return None
    return (sample.wall_seconds - sum(w for w in work if w is not None)) / sample.trials


def steady_overhead(sample: Sample) -> float | None:
    """The median over trials 2..N of (its start instant - the previous trial's) - the previous trial's training
    + evaluation: what a trial costs beyond them once the sweep runs."""
    ordered = [sample.instants[job] for job in sorted(sample.instants, key=int)]
    gaps = []
    for before, after in pairwise(ordered):
        work = working(before)
        if before["start"] is not None and after["start"] is not None and work is not None:
            gaps.append(after["start"] - before["start"] - work)
    return statistics.median(gaps) if gaps else None


def metrics_identical(samples: list[Sample]) -> str:
    """yes / no: every warm trial's compared metrics equal the cold trial's of the same job number, round by round
    (n/a without a warm and a cold sweep of one round)."""
    verdicts = []
    for warm in (s for s in samples if s.variant == "warm" and s.returncode == 0):
        for cold in (s for s in samples if s.variant == "cold" and s.returncode == 0 and s.round == warm.round):
            verdicts.append(bool(warm.metrics) and warm.metrics == cold.metrics)
    if not verdicts:
        return "n/a"
    return "yes" if all(verdicts) else "no"


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def _median(values: list[float | None]) -> str:
    present = [value for value in values if value is not None]
    missing = len(values) - len(present)
    if not present:
        return "missing"
    return f"{statistics.median(present):.2f}" + (f" ({missing} missing)" if missing else "")


def wall_table(samples: list[Sample], variants: list[str]) -> str:
    """One row per variant: wall seconds (min / median / max), x the in-process study, runs FINISHED, best."""
    inprocess = [s.wall_seconds for s in samples if s.variant == "inprocess" and s.returncode == 0]
    header = ["variant", "wall s (min / median / max)", "x in-process (median)", "trials FINISHED", "best val_accuracy"]
    rows = []
    for variant in variants:
        runs = [s for s in samples if s.variant == variant]
        ok = [s for s in runs if s.returncode == 0]
        if not ok:
            rows.append([variant, "failed", "", f"0/{runs[0].trials}" if runs else "", ""])
            continue
        median = statistics.median(s.wall_seconds for s in ok)
        ratio = f"{median / statistics.median(inprocess):.2f}" if inprocess else "n/a"
        worst = min(ok, key=lambda s: s.finished)
        finished = f"{worst.finished}/{worst.trials}"
        if variant != "inprocess":
            finished += f" ({min(s.with_model for s in ok)} with a model)"
        failed = f", {len(runs) - len(ok)} failed" if len(ok) < len(runs) else ""
        best = ", ".join(f"{s.best_value:.4f}" for s in ok if s.best_value is not None)
        rows.append([variant, _spread([s.wall_seconds for s in ok]) + failed, ratio, finished, best])
    return markdown(header, "lrrrr", rows)


def phase_table(samples: list[Sample]) -> str:
    """Rows: the phases (medians over the trials of all rounds) and the overheads; columns: warm, cold."""
    columns = [v for v in RUNNER_VARIANTS if any(s.variant == v and s.returncode == 0 for s in samples)]
    by_variant = {v: [s for s in samples if s.variant == v and s.returncode == 0] for v in columns}
    rows = []
    for phase, _, _ in PHASES:
        cells = [
            _median([phases(instants)[phase] for s in by_variant[v] for instants in s.instants.values()])
            for v in columns
        ]
        rows.append([f"{phase} s", *cells])
    rows.append(
        [
            "trial overhead beyond training and evaluation s",
            *(_median([overhead(s) for s in by_variant[v]]) for v in columns),
        ]
    )
    rows.append(
        [
            "steady: start-to-start gap less training and evaluation s",
            *(_median([steady_overhead(s) for s in by_variant[v]]) for v in columns),
        ]
    )
    return markdown(["phase (median over trials)", *columns], "l" + "r" * len(columns), rows)


def memory_lines(samples: list[Sample]) -> str:
    """Per warm variant: how many workers ran, each one's resident MiB when first and last seen, and the peak."""
    text = ""
    for variant in ("warm", "champion"):
        workers = [
            (s.round, pid, mib)
            for s in samples
            if s.variant == variant and s.returncode == 0
            for pid, mib in s.worker_mib.items()
            if mib
        ]
        if not workers:
            continue
        spans = ", ".join(f"{mib[0]:.0f} -> {mib[-1]:.0f}" for _, _, mib in workers)
        peak = max(max(mib) for _, _, mib in workers)
        text += (
            f"Warm workers ({variant}): {len(workers)} over the rounds; resident MiB first seen -> last seen: {spans}; "
            f"peak {peak:.0f} MiB.\n"
        )
    return text


def inprocess_line(samples: list[Sample]) -> str:
    seconds = [t for s in samples if s.variant == "inprocess" and s.returncode == 0 for t in s.trial_seconds]
    if not seconds:
        return ""
    return f"In-process study: {statistics.median(seconds):.2f} s per trial (median objective call).\n"


def section(samples: list[Sample], trials: int, variants: list[str]) -> str:
    ours = [s for s in samples if s.trials == trials]
    text = f"## {trials} trials\n\n{wall_table(ours, variants)}\n\n"
    if any(s.variant in RUNNER_VARIANTS and s.returncode == 0 for s in ours):
        text += f"{phase_table(ours)}\n\n"
    text += inprocess_line(ours)
    text += memory_lines(ours)
    text += f"Metrics identical (warm vs cold, {', '.join(COMPARED_METRICS)} by job number): "
    text += f"{metrics_identical(ours)}.\n"
    for failed in (s for s in ours if s.returncode != 0):
        text += f"\n{failed.variant}, round {failed.round + 1}: exit {failed.returncode}; its last lines:\n\n"
        text += "```\n" + failed.output_tail + "\n```\n"
    return text


def report(args: argparse.Namespace, about: str, samples: list[Sample]) -> str:
    workload = (
        f"Fashion-MNIST, {args.train_examples} training examples (10% held out for validation), "
        f"{args.test_examples} test examples, 1 epoch per trial, strategy=one_device, {args.repeats} round(s)"
    )
    parts = [f"Machine: {about}.\n\nWorkload: {workload}.\n"]
    parts += [section(samples, trials, args.variants) for trials in args.trials]
    return "\n".join(parts)


def save(path: str, about: str, args: argparse.Namespace, samples: list[Sample]) -> None:
    document: dict[str, Any] = {
        "machine": about,
        "args": vars(args),
        "samples": [dataclasses.asdict(s) for s in samples],
    }
    Path(path).write_text(json.dumps(document, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    about = machine()
    print(f"Machine: {about}", flush=True)
    samples: list[Sample] = []
    for trials in args.trials:
        for round_ in range(args.repeats):
            shift = round_ % len(args.variants)
            for variant in args.variants[shift:] + args.variants[:shift]:
                sample = measure(args, variant, trials, round_)
                samples.append(sample)
                print(
                    f"{trials} trials, round {round_ + 1}/{args.repeats}, {variant}: {sample.wall_seconds:.1f} s, "
                    f"exit {sample.returncode}, {sample.finished} FINISHED",
                    file=sys.stderr,
                    flush=True,
                )
                if args.json:
                    save(args.json, about, args, samples)
    text = report(args, about, samples)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()

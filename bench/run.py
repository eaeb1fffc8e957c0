"""The interleaved benchmark: the reference loop and runner variants, round after round, on one machine.

Every round runs each (replicas, variant) once, starting one place later than the round before, so
no variant always runs first or right after another. Each run is a fresh process (the CPU split needs
one). Results: a Markdown table (stdout, and --markdown), raw samples (--json), a chart (--chart).

    python -m bench --train-examples 20000 --epochs 3 --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

from bench.measure import run_timed
from bench.report import Sample, markdown_table, plot, summarise
from bench.tracker_cost import measure_tracker
from bench.variants import REFERENCE, Variant, Workload, parse_variant

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data" / "fashion-mnist"
DEFAULT_VARIANTS = [REFERENCE, "for_in", "iterator", "in_function", "multi_step"]


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as handle:
            model = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    flags = []
    try:
        with open("/proc/cpuinfo") as handle:
            cpu_flags = next((line for line in handle if line.startswith("flags")), "").split()
        flags = [flag for flag in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if flag in cpu_flags]
    except OSError:
        pass
    return (f"{model} (vector extensions: {', '.join(flags) or 'none listed'}), {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, TensorFlow {importlib.metadata.version('tensorflow')}, "
            f"{datetime.date.today().isoformat()}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(SHARED_DATA) if SHARED_DATA.is_dir() else None,
                        help="Fashion-MNIST IDX files (default: ../shared/data/fashion-mnist; synthetic if absent)")
    parser.add_argument("--train-examples", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=3, help="per run; the first is left out of examples/s")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every variant")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS,
                        help="`reference`, a loop style, or `name=runner overrides ...` (quoted)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--json", help="write the raw samples here")
    parser.add_argument("--markdown", help="write the machine, the table and the tracker's cost here")
    parser.add_argument("--chart", help="write the PNG chart here")
    args = parser.parse_args(argv)
    if REFERENCE not in [spec.partition("=")[0] for spec in args.variants]:
        parser.error("--variants must include `reference`: every ratio is taken against it")
    return args


def run_once(variant: Variant, work: Workload, workdir: str, tracking_uri: str, round_: int, timeout: float
             ) -> tuple[Sample, str]:
    run_dir = os.path.join(workdir, f"{variant.name}-{variant.replicas}r-{round_}")
    finished = run_timed(variant.command(work, run_dir, tracking_uri), variant.marker, workdir, timeout, variant.env)
    sample = Sample(variant.name, variant.replicas, round_, variant.overrides + variant.env,
                    tuple(variant.examples_per_second(finished, run_dir, tracking_uri)),
                    finished.first_step_seconds, finished.wall_seconds)
    return sample, run_dir


def tracker_section(tracking_uri: str, workdir: str, runner_run_dir: str, rows, train_examples: int) -> str:
    """The tracker's cost per epoch, against the training time of an epoch of the first runner variant."""
    from omegaconf import OmegaConf

    from runner.tracking import flatten

    params = flatten(OmegaConf.to_container(OmegaConf.load(os.path.join(runner_run_dir, ".hydra", "config.yaml"))))
    cost = measure_tracker(tracking_uri, os.path.join(workdir, "tracker"), params,
                           os.path.join(runner_run_dir, "checkpoints"))
    lines = ["| MLflow call (sqlite store) | ms |", "| --- | ---: |",
             f"| create the run, log {len(params)} params (once) | {cost.start_ms:.0f} |",
             f"| log one epoch's metrics | {cost.epoch_ms:.1f} |",
             f"| log one checkpoint ({cost.checkpoint_bytes / 1e6:.1f} MB) as artifacts | {cost.checkpoint_ms:.1f} |"]
    row = next(row for row in rows if not row.variant.startswith(REFERENCE))
    epoch_seconds = train_examples / row.examples_per_second.median
    per_epoch_seconds = (cost.epoch_ms + cost.checkpoint_ms / 2) / 1000  # checkpoint.every_epochs=2
    lines.append(f"\nPer epoch of {train_examples} examples with `{row.variant}` on {row.replicas} replica(s) "
                 f"({epoch_seconds:.1f} s of training), its metrics and half a checkpoint cost "
                 f"{per_epoch_seconds * 1000:.0f} ms, {100 * per_epoch_seconds / epoch_seconds:.2f}% of the epoch.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    work = Workload(args.data_dir, args.train_examples, args.epochs)
    variants = [parse_variant(spec, replicas) for replicas in args.replicas for spec in args.variants]
    workdir = tempfile.mkdtemp(prefix="bench-")
    tracking_uri = f"sqlite:///{workdir}/mlflow.db"
    samples, runner_run_dir = [], None
    try:
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri).search_experiments()  # create the store once, as a user's already exists
        for round_ in range(args.repeats):
            shift = round_ % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                sample, run_dir = run_once(variant, work, workdir, tracking_uri, round_, args.timeout)
                samples.append(sample)
                if not variant.is_reference:
                    runner_run_dir = run_dir
                print(f"round {round_ + 1}/{args.repeats} {variant.name} x{variant.replicas}: "
                      f"{sample.examples_per_second:.0f} examples/s, first step {sample.first_step_seconds:.1f} s",
                      file=sys.stderr, flush=True)
                if args.json:
                    with open(args.json, "w") as handle:
                        json.dump([dataclasses.asdict(s) for s in samples], handle, indent=1)
        rows = summarise(samples)
        data = f"Fashion-MNIST ({args.data_dir})" if args.data_dir else "synthetic data"
        heading = (f"Machine: {machine()}.\n\nWorkload: {data}, {args.train_examples} training examples, "
                   f"batch 64 per replica, {args.epochs} epochs per run (examples/s: the median of epochs 2-"
                   f"{args.epochs}), {args.repeats} interleaved rounds; medians with (min-max).\n\n")
        text = heading + markdown_table(rows)
        if runner_run_dir:
            text += "\n" + tracker_section(tracking_uri, workdir, runner_run_dir, rows, args.train_examples)
        print(text)
        if args.markdown:
            Path(args.markdown).write_text(text)
        if args.chart:
            plot(rows, args.chart, f"runner vs the tutorial's loop ({args.train_examples} examples, "
                                   f"{args.repeats} rounds)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

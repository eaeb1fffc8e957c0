"""The interleaved benchmark: the reference loop and runner variants, round after round, on one machine.

Every round runs each (replicas, variant) once, starting one place later than the round before, so
no variant always runs first or right after another. Each run is a fresh process (the CPU split needs
one). Results: a Markdown table (stdout, and --markdown), raw samples (--json), a chart (--chart).
`--from-json` makes the table and chart again from saved samples, e.g. against another `--baseline`.

    python -m bench --train-examples 20000 --epochs 3 --repeats 3 --json bench.json
    python -m bench --from-json bench.json --baseline reference+heap
    python -m bench --variants fit fit20 for_in multi_step --baseline fit --against multi_step=fit20
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
from bench.records import write as write_files
from bench.report import Sample, markdown_table, memory_table, plot, slowest_rounds_table, summarise
from bench.tracker_cost import measure_tracker
from bench.variants import REFERENCE, Variant, Workload, is_script, parse_variant

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
    return (
        f"{model} (vector extensions: {', '.join(flags) or 'none listed'}), {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, TensorFlow {importlib.metadata.version('tensorflow')}, "
        f"{datetime.date.today().isoformat()}"
    )


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-dir",
        default=str(SHARED_DATA) if SHARED_DATA.is_dir() else None,
        help="Fashion-MNIST IDX files (default: ../shared/data/fashion-mnist; synthetic if absent)",
    )
    parser.add_argument("--train-examples", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=3, help="per run; the first is left out of examples/s")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every variant")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--variants",
        nargs="+",
        default=DEFAULT_VARIANTS,
        help="`reference`, a loop style, `deterministic`, `multi_step+deterministic`, or `name=runner "
        "overrides ...` (quoted)",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--json", help="write the raw samples here")
    parser.add_argument("--markdown", help="write the machine, the table and the tracker's cost here")
    parser.add_argument("--chart", help="write the PNG chart here")
    parser.add_argument(
        "--baseline", default=REFERENCE, help="the variant every ratio is taken against (default: reference)"
    )
    parser.add_argument(
        "--against",
        nargs="+",
        default=[],
        metavar="VARIANT=BASELINE",
        help="a baseline of its own for a variant, e.g. multi_step=fit20 (model.fit with 20 steps per execution)",
    )
    parser.add_argument("--from-json", help="run nothing: report the samples a --json file holds")
    args = parser.parse_args(argv)
    malformed = [item for item in args.against if not all(item.partition("=")[::2])]
    if malformed:
        parser.error(f"--against takes VARIANT=BASELINE pairs, not {' '.join(malformed)}")
    args.against = dict(item.split("=", 1) for item in args.against)
    names = [spec.partition("=")[0] for spec in args.variants]
    for baseline in {args.baseline, *args.against.values()}:
        if not args.from_json and baseline not in names:
            parser.error(f"--variants must include the baseline `{baseline}`: ratios are taken against it")
    return args


def run_once(
    variant: Variant, work: Workload, workdir: str, tracking_uri: str, round_: int, timeout: float
) -> tuple[Sample, str]:
    run_dir = os.path.join(workdir, f"{variant.name}-{variant.replicas}r-{round_}")
    finished = run_timed(variant.command(work, run_dir, tracking_uri), variant.marker, workdir, timeout, variant.env)
    data = (f"data:{variant.data.kind}*{variant.data.copies}",) if variant.data is not None else ()
    sample = Sample(
        variant.name,
        variant.replicas,
        round_,
        variant.overrides + variant.env + data,
        tuple(variant.examples_per_second(finished, run_dir, tracking_uri)),
        finished.first_step_seconds,
        finished.wall_seconds,
        finished.peak_rss_mb,
    )
    return sample, run_dir


def tracker_section(tracking_uri: str, workdir: str, runner_run_dir: str, rows, train_examples: int) -> str:
    """The tracker's cost per epoch, against the training time of an epoch of the first runner variant."""
    from omegaconf import OmegaConf

    from runner.tracking.params import flatten

    params = flatten(OmegaConf.to_container(OmegaConf.load(os.path.join(runner_run_dir, ".hydra", "config.yaml"))))
    cost = measure_tracker(
        tracking_uri, os.path.join(workdir, "tracker"), params, os.path.join(runner_run_dir, "checkpoints")
    )
    lines = [
        "| MLflow call (sqlite store) | ms |",
        "| --- | ---: |",
        f"| create the run, log {len(params)} params (once) | {cost.start_ms:.0f} |",
        f"| log one epoch's metrics | {cost.epoch_ms:.1f} |",
        f"| log one checkpoint ({cost.checkpoint_bytes / 1e6:.1f} MB) as artifacts | {cost.checkpoint_ms:.1f} |",
    ]
    row = next(row for row in rows if not is_script(row.variant))
    epoch_seconds = train_examples / row.examples_per_second.median
    per_epoch_seconds = (cost.epoch_ms + cost.checkpoint_ms / 2) / 1000  # checkpoint.every_epochs=2
    lines.append(
        f"\nPer epoch of {train_examples} examples with `{row.variant}` on {row.replicas} replica(s) "
        f"({epoch_seconds:.1f} s of training), its metrics and half a checkpoint cost "
        f"{per_epoch_seconds * 1000:.0f} ms, {100 * per_epoch_seconds / epoch_seconds:.2f}% of the epoch."
    )
    return "\n".join(lines) + "\n"


def describe(args: argparse.Namespace) -> dict[str, str]:
    """The machine and the workload, as the report's heading states them."""
    data = f"Fashion-MNIST ({args.data_dir})" if args.data_dir else "synthetic data"
    return {
        "machine": machine(),
        "workload": f"{data}, {args.train_examples} training examples, batch 64 per replica, {args.epochs} "
        f"epochs per run (examples/s: the median of epochs 2-{args.epochs}), {args.repeats} "
        f"interleaved rounds; medians with (min-max)",
        "title": f"runner vs the tutorial's loop ({args.train_examples} examples, {args.repeats} rounds)",
    }


def save(path: str, about: dict[str, str], samples: list[Sample]) -> None:
    with open(path, "w") as handle:
        json.dump({**about, "samples": [dataclasses.asdict(s) for s in samples]}, handle, indent=1)


def load(path: str) -> tuple[dict[str, str], list[Sample]]:
    with open(path) as handle:
        saved = json.load(handle)
    samples = [
        Sample(
            **{
                **s,
                "overrides": tuple(s["overrides"]),
                "epoch_examples_per_second": tuple(s["epoch_examples_per_second"]),
            }
        )
        for s in saved.pop("samples")
    ]
    return saved, samples


def report(args: argparse.Namespace, about: dict[str, str], rows, tracker_text: str = "", samples=()) -> None:
    text = f"Machine: {about['machine']}.\n\nWorkload: {about['workload']}.\n\n"
    text += markdown_table(rows, args.baseline)
    slowest = slowest_rounds_table(rows)
    text += f"\n{slowest}" if slowest else ""
    text += f"\n{tracker_text}" if tracker_text else ""
    memory = memory_table(list(samples))
    text += f"\n{memory}" if memory else ""
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.chart:
        plot(rows, args.chart, about["title"], args.baseline)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.from_json:
        about, samples = load(args.from_json)
        try:
            rows = summarise(samples, args.baseline, args.against)
        except ValueError as error:
            sys.exit(f"error: {error} in {args.from_json}; pick one of its variants as --baseline")
        report(args, about, rows, samples=samples)
        return
    about = describe(args)
    work = Workload(args.data_dir, args.train_examples, args.epochs)
    variants = [parse_variant(spec, replicas) for replicas in args.replicas for spec in args.variants]
    workdir = tempfile.mkdtemp(prefix="bench-")
    tracking_uri = f"sqlite:///{workdir}/mlflow.db"
    samples, runner_run_dir = [], None
    try:
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri).search_experiments()  # create the store once, as a user's already exists
        for variant in variants:  # the workload as files, for the variants that read them
            if variant.data is not None:
                write_files(variant.data, args.data_dir, args.train_examples, workdir)
        for round_ in range(args.repeats):
            shift = round_ % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                sample, run_dir = run_once(variant, work, workdir, tracking_uri, round_, args.timeout)
                samples.append(sample)
                if not variant.is_reference:
                    runner_run_dir = run_dir
                print(
                    f"round {round_ + 1}/{args.repeats} {variant.name} x{variant.replicas}: "
                    f"{sample.examples_per_second:.0f} examples/s, first step {sample.first_step_seconds:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
                if args.json:
                    save(args.json, about, samples)
        rows = summarise(samples, args.baseline, args.against)
        tracker_text = (
            tracker_section(tracking_uri, workdir, runner_run_dir, rows, args.train_examples) if runner_run_dir else ""
        )
        report(args, about, rows, tracker_text, samples)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

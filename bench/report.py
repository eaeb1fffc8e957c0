"""From raw benchmark samples to medians, spreads and ratios to a baseline: a Markdown table and a chart.

Ratios are taken round by round (a variant against the baseline run in the same round, minutes apart)
and then summarised, so slow drifts of the machine's speed cancel out. The baseline is the reference
script unless another variant is named (`reference+heap`: the reference with the runner's heap setting);
`against` gives some variants a baseline of their own (`multi_step` against `fit20`, model.fit with as
many steps per call).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from bench.variants import REFERENCE, is_script


@dataclass(frozen=True)
class Sample:
    """One run of one variant: its steady examples/second (epoch 1, which traces, left out)."""

    variant: str
    replicas: int
    round: int
    overrides: tuple[str, ...]
    epoch_examples_per_second: tuple[float, ...]
    first_step_seconds: float | None
    wall_seconds: float
    peak_rss_mb: float | None = None  # the training process's peak resident memory

    @property
    def examples_per_second(self) -> float:
        steady = self.epoch_examples_per_second[1:] or self.epoch_examples_per_second
        return statistics.median(steady)


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def __str__(self) -> str:
        if self.median >= 100:
            return f"{self.median:.0f} ({self.low:.0f}-{self.high:.0f})"
        return f"{self.median:.2f} ({self.low:.2f}-{self.high:.2f})"


@dataclass(frozen=True)
class Row:
    variant: str
    replicas: int
    overrides: tuple[str, ...]
    examples_per_second: Spread
    speed_ratio: Spread  # examples/second over the baseline's, round by round
    first_step_seconds: Spread
    first_step_ratio: Spread
    baseline: str = REFERENCE  # the variant of the ratios
    # The slowest round's examples/s over the baseline's slowest round's: how far the worst run falls.
    slowest_ratio: float = 1.0


def markdown(header: list[str], align: str, rows: list[list[str]]) -> str:
    """A Markdown table: `header`'s columns, `align` one letter per column (l: left, r: right), then `rows`."""
    rule = "|".join("---" if letter == "l" else "---:" for letter in align)
    return "\n".join([f"| {' | '.join(header)} |", f"|{rule}|", *(f"| {' | '.join(cells)} |" for cells in rows)])


def summarise(samples: list[Sample], baseline: str = REFERENCE, against: dict[str, str] | None = None) -> list[Row]:
    """One row per (replicas, variant), its ratios taken against `baseline`, or `against[variant]`."""
    rows = []
    for replicas, variant in dict.fromkeys((s.replicas, s.variant) for s in samples):
        own_baseline = (against or {}).get(variant, baseline)
        reference = {s.round: s for s in samples if (s.variant, s.replicas) == (own_baseline, replicas)}
        if not reference:
            raise ValueError(f"no runs of the baseline {own_baseline!r} among the samples")
        runs = [s for s in samples if (s.replicas, s.variant) == (replicas, variant)]
        paired = [(s, reference[s.round]) for s in runs if s.round in reference]
        rows.append(
            Row(
                variant=variant,
                replicas=replicas,
                overrides=runs[0].overrides,
                examples_per_second=Spread.of([s.examples_per_second for s in runs]),
                speed_ratio=Spread.of([s.examples_per_second / r.examples_per_second for s, r in paired]),
                first_step_seconds=Spread.of([s.first_step_seconds for s in runs]),
                first_step_ratio=Spread.of([s.first_step_seconds / r.first_step_seconds for s, r in paired]),
                baseline=own_baseline,
                slowest_ratio=min(s.examples_per_second for s in runs)
                / min(r.examples_per_second for r in reference.values()),
            )
        )
    return rows


def markdown_table(rows: list[Row], baseline: str = REFERENCE) -> str:
    lines = [
        f"| replicas | variant | examples/s | x {baseline} | first step (s) | x {baseline} | overrides |",
        "| ---: | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        overrides = " ".join(f"`{item}`" for item in row.overrides)
        if is_script(row.variant):
            overrides = f"bench/reference.py {overrides}".strip()
        # A row with a baseline of its own names it.
        against = "" if row.baseline == baseline else f" x {row.baseline}"
        lines.append(
            f"| {row.replicas} | {row.variant} | {row.examples_per_second} | {row.speed_ratio}{against} | "
            f"{row.first_step_seconds} | {row.first_step_ratio}{against} | {overrides} |"
        )
    return "\n".join(lines) + "\n"


def slowest_rounds_table(rows: list[Row]) -> str:
    """Each runner variant's slowest round against its baseline's slowest round: the worst a run fell to."""
    measured = [row for row in rows if not is_script(row.variant)]
    if not measured:
        return ""
    lines = [
        "| replicas | variant | slowest round (examples/s) | x the slowest round of |",
        "| ---: | --- | ---: | --- |",
    ]
    for row in measured:
        lines.append(
            f"| {row.replicas} | {row.variant} | {row.examples_per_second.low:.0f} | "
            f"{row.slowest_ratio:.2f} {row.baseline} |"
        )
    return "\n".join(lines) + "\n"


def memory_table(samples: list[Sample]) -> str:
    """Each variant's peak resident memory (MB) over its runs: median (min-max)."""
    measured = [s for s in samples if s.peak_rss_mb is not None and not is_script(s.variant)]
    if not measured:
        return ""
    lines = [
        "| replicas | variant | peak RSS of the training process (MB) | overrides |",
        "| ---: | --- | ---: | --- |",
    ]
    for replicas, variant in dict.fromkeys((s.replicas, s.variant) for s in measured):
        runs = [s for s in measured if (s.replicas, s.variant) == (replicas, variant)]
        overrides = " ".join(f"`{item}`" for item in runs[0].overrides)
        lines.append(f"| {replicas} | {variant} | {Spread.of([s.peak_rss_mb for s in runs])} | {overrides} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], path: str, title: str, baseline: str = REFERENCE) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [
        f"{row.variant} ({row.replicas}r)" + ("" if row.baseline == baseline else f", x {row.baseline}") for row in rows
    ]
    positions = range(len(rows))
    figure, (speed, startup) = plt.subplots(1, 2, figsize=(12, 0.45 * len(rows) + 1.8), sharey=True)
    for axis, key, marks, xlabel in (
        (speed, "speed_ratio", (0.97, 1.5), f"examples/s, x {baseline} (median; bars: min-max)"),
        (startup, "first_step_ratio", (1.2,), f"start-up to first step, x {baseline}"),
    ):
        spreads = [getattr(row, key) for row in rows]
        colors = ["0.6" if is_script(row.variant) else f"C{row.replicas - 1}" for row in rows]
        axis.barh(
            list(positions),
            [s.median for s in spreads],
            color=colors,
            xerr=[[s.median - s.low for s in spreads], [s.high - s.median for s in spreads]],
            capsize=3,
        )
        axis.axvline(1.0, color="black", linewidth=0.8)
        for mark in marks:
            axis.axvline(mark, color="C3", linestyle="--", linewidth=0.8)
        axis.set_xlabel(xlabel)
    speed.set_yticks(list(positions), labels)
    speed.invert_yaxis()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)

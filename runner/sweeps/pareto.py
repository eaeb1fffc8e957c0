"""A sweep over several objectives: which of its configurations no other beats on every objective (the Pareto
front). A configuration dominates another where it is at least as good on every objective and better on one; the
front is every configuration none dominates. Plain numbers in, names out: the summary gives each configuration's
means over its runs (runner.sweeps.report.summary)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def dominates(one: Sequence[float], other: Sequence[float], lower_is_better: Sequence[bool]) -> bool:
    """`one` is at least as good as `other` on every objective and better on at least one."""
    signs = [1.0 if lower else -1.0 for lower in lower_is_better]
    ours = [sign * value for sign, value in zip(signs, one, strict=True)]
    theirs = [sign * value for sign, value in zip(signs, other, strict=True)]
    return all(a <= b for a, b in zip(ours, theirs, strict=True)) and any(
        a < b for a, b in zip(ours, theirs, strict=True)
    )


def pareto_front(points: Mapping[str, Sequence[float]], lower_is_better: Sequence[bool]) -> list[str]:
    """The names of `points` (each a value per objective) that no other point dominates, in their given order."""
    return [
        name
        for name, values in points.items()
        if not any(dominates(other, values, lower_is_better) for key, other in points.items() if key != name)
    ]

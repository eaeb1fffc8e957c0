"""Pictures of runs: one run's loss and score curves per epoch, and a sweep's jobs side by side."""

from __future__ import annotations


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend, imported when a picture is drawn: the import
    takes half a second, which training should not wait for."""
    import matplotlib  # noqa: PLC0415  matplotlib: seconds to import, only where curves are drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  matplotlib: as above, and only after use("Agg")

    return plt


def import_pyplot() -> None:
    """Import matplotlib's pyplot now, where a process has time to spare before it draws
    (runner.sweeps.report.outputs)."""
    _pyplot()


def integer_epochs(axis, epochs) -> None:
    """Ticks on whole epochs only: each epoch where there are 20 or fewer (matplotlib would put a lone epoch 1
    between ticks 0.94 ... 1.06), else whole numbers matplotlib picks."""
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415  matplotlib: only where curves are drawn

    if 0 < len(epochs) <= 20:
        axis.set_xticks(sorted(epochs))
    else:
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_curves(histories, path: str, title: str = "", metrics: tuple[str, ...] = ("loss", "accuracy")) -> str:
    """Write train/test loss and each score of `metrics` against epoch to a PNG at `path`, a panel each.

    `histories` maps a metric name to its (epoch, value) pairs, as MLflow's metric history gives them.
    """
    plt = _pyplot()
    figure = curves_figure(histories, title, metrics)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def curves_figure(histories, title: str = "", metrics: tuple[str, ...] = ("loss", "accuracy")):
    """plot_curves' figure: a panel per metric (the loss, then the scores), train and test in each."""
    plt = _pyplot()
    figure, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), squeeze=False)
    epochs = {step for points in histories.values() for step, _ in points}
    for axis, metric in zip(axes[0], metrics, strict=True):
        for split, marker in (("train", "o-"), ("test", "s-")):
            points = histories.get(f"{split}_{metric}", [])
            axis.plot([step for step, _ in points], [value for _, value in points], marker, label=split)
        axis.set(xlabel="epoch", ylabel=metric, title=metric)
        axis.grid(alpha=0.3)
        axis.legend()
        integer_epochs(axis, epochs)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure


def plot_sweep_curves(curves, path: str, title: str = "", score: str | None = "test_accuracy") -> str:
    """Compare a sweep's configurations: test accuracy, and test (solid) / train (dashed) loss against epoch,
    each configuration's mean over its seeds as a line, with a band from the lowest to the highest seed.

    `curves` maps a configuration's label to {metric name: [(epoch, mean, min, max), ...]}.
    """
    plt = _pyplot()
    figure = sweep_curves_figure(curves, title, score)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path


def sweep_curves_figure(curves, title: str = "", score: str | None = "test_accuracy"):
    """plot_sweep_curves' figure: the score's panel (the first of the sweep's: test_accuracy by default; None: the
    run has no score, and the panel stays empty) and the loss panel."""
    plt = _pyplot()
    figure, (accuracy_axis, loss_axis) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (label, metrics) in enumerate(curves.items()):
        color = colors[index % len(colors)]
        for axis, metric, style, name in (
            (accuracy_axis, score, "o-", label),
            (loss_axis, "test_loss", "o-", label),
            (loss_axis, "train_loss", "x--", None),
        ):
            points = (metrics.get(metric) if metric else None) or []
            if points:
                steps, means, lows, highs = zip(*points, strict=True)
                axis.plot(steps, means, style, color=color, label=name)
                if metric != "train_loss":  # one band per panel and configuration keeps the picture legible
                    axis.fill_between(steps, lows, highs, color=color, alpha=0.2, linewidth=0)
    name = (score or "").removeprefix("test_")
    accuracy_axis.set(xlabel="epoch", ylabel=name, title=f"test {name}".strip())
    loss_axis.set(xlabel="epoch", ylabel="loss", title="loss (test solid, train dashed)")
    epochs = sorted({point[0] for metrics in curves.values() for points in metrics.values() for point in points})
    for axis in (accuracy_axis, loss_axis):
        axis.grid(alpha=0.3)
        integer_epochs(axis, epochs)
    if curves:
        # One legend for both panels, outside them: a sweep can have many configurations with long labels.
        figure.legend(
            *accuracy_axis.get_legend_handles_labels(),
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
            fontsize="small",
            title="mean over seeds;\nband: min to max",
        )
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure

"""Pictures of a run: loss and accuracy curves per epoch."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_curves(history, path: str, title: str = "") -> str:
    """Write train/test loss and accuracy against epoch to a PNG at `path`."""
    epochs = [r.epoch for r in history]
    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(10, 4))
    loss_axis.plot(epochs, [r.train_loss for r in history], "o-", label="train")
    loss_axis.plot(epochs, [r.test_loss for r in history], "s-", label="test")
    loss_axis.set(xlabel="epoch", ylabel="loss", title="loss")
    accuracy_axis.plot(epochs, [r.train_accuracy for r in history], "o-", label="train")
    accuracy_axis.plot(epochs, [r.test_accuracy for r in history], "s-", label="test")
    accuracy_axis.set(xlabel="epoch", ylabel="accuracy", title="accuracy")
    for axis in (loss_axis, accuracy_axis):
        axis.grid(alpha=0.3)
        axis.legend()
        axis.xaxis.get_major_locator().set_params(integer=True)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path

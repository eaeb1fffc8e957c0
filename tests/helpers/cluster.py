"""What a distributed run must equal: the same training on one machine's two mirrored CPU replicas."""

from __future__ import annotations

from pathlib import Path

from helpers.cli import run_cli
from helpers.presets import TWO_EPOCHS
from helpers.tracking import metric_history, mlflow_client


def train_losses(client, run_id: str) -> list[float]:
    """The run's train_loss per epoch (without the best epoch's logged again after the last, checkpoint.keep_best)."""
    after_last = client.get_run(run_id).data.tags.get("best_metrics_step")
    return [
        value
        for step, value in metric_history(client, run_id, "train_loss")
        if after_last is None or step < int(after_last)
    ]


def assert_losses_match_two_mirrored_replicas(client, run_id: str, tmp_path: Path, label: str) -> None:
    """The run's per-epoch train_loss equals that of `strategy=mirrored strategy.cpu_replicas=2` with the same
    seed and global batch (TWO_EPOCHS, batch 32 per replica), trained here as the reference."""
    reference = run_cli(
        *TWO_EPOCHS,
        f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mirrored.db'}",
        f"hydra.run.dir={tmp_path / 'mirrored'}",
        "strategy=mirrored",
        "strategy.cpu_replicas=2",
        "batch=32",
        cwd=tmp_path,
    )
    assert reference.returncode == 0, reference.stderr[-3000:]
    mirrored = mlflow_client(f"sqlite:///{tmp_path / 'mirrored.db'}")
    expected = train_losses(mirrored, (tmp_path / "mirrored" / "mlflow_run_id.txt").read_text().strip())
    losses = train_losses(client, run_id)
    differences = [abs(ours - theirs) / theirs for ours, theirs in zip(losses, expected, strict=False)]
    print(f"{label} vs mirrored train_loss: {losses} vs {expected}, relative differences {differences}")
    assert len(losses) == 2 and max(differences) < 1e-3, (losses, expected)

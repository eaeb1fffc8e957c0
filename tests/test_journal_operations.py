"""What the tracker process journals: each operation is kept under the op name and argument names the journal has
always held, so a journal left by one version of the runner is delivered by the next one."""

from __future__ import annotations

import json

import pytest

from runner.tracking import journal
from runner.tracking.operations import (
    KINDS,
    End,
    LogArtifact,
    LogInputs,
    LogMetrics,
    LogText,
    SetTags,
    SystemMetrics,
    from_journal,
    journal_args,
)

# One of each kind, with the record a journal holds for it (op, args), written out as the journal's lines have it.
OPERATIONS = [
    (
        LogMetrics({"train_loss": 0.5}, 3, 1_700_000_000_000),
        "log_metrics",
        {"metrics": {"train_loss": 0.5}, "step": 3, "timestamp": 1_700_000_000_000},
    ),
    (
        SystemMetrics({"system/cpu_utilization_percentage": 12.5}, 0, 1_700_000_000_001),
        "system_metrics",
        {"metrics": {"system/cpu_utilization_percentage": 12.5}, "step": 0, "timestamp": 1_700_000_000_001},
    ),
    (LogText("batch: 64\n", "config.yaml"), "log_text", {"text": "batch: 64\n", "artifact_file": "config.yaml"}),
    (
        LogArtifact("/runs/a/checkpoints/ckpt-1.index", "checkpoints"),
        "log_artifact",
        {"path": "/runs/a/checkpoints/ckpt-1.index", "artifact_path": "checkpoints"},
    ),
    (LogArtifact("/runs/a/curves.png"), "log_artifact", {"path": "/runs/a/curves.png", "artifact_path": None}),
    (SetTags({"best_epoch": "5"}), "set_tags", {"tags": {"best_epoch": "5"}}),
    (
        LogInputs([{"name": "train", "digest": "abc", "context": "training"}]),
        "log_inputs",
        {"descriptions": [{"name": "train", "digest": "abc", "context": "training"}]},
    ),
    (
        End("ZeroDivisionError: division by zero", False),
        "end",
        {"message": "ZeroDivisionError: division by zero", "resumable": False},
    ),
    (End(None, False), "end", {"message": None, "resumable": False}),
]


@pytest.mark.parametrize("operation,op,args", OPERATIONS)
def test_each_operation_is_journaled_as_the_op_and_args_the_journal_holds(operation, op, args):
    assert (operation.op, journal_args(operation)) == (op, args)
    assert from_journal(op, json.loads(json.dumps(args))) == operation


def test_every_kind_has_its_own_op_and_an_unknown_op_is_refused():
    assert sorted(KINDS) == [
        "end",
        "log_artifact",
        "log_inputs",
        "log_metrics",
        "log_text",
        "set_tags",
        "system_metrics",
    ]
    with pytest.raises(ValueError, match="unknown journal record 'log_model'"):
        from_journal("log_model", {"path": "model"})


def test_a_journal_written_with_operations_reads_back_as_the_same_operations(tmp_path):
    """Through the run directory's journal file, as the delivery thread and the replay command read it: an
    artifact's file is copied into the journal and delivered from the copy; the older metrics record without a
    timestamp (logged when delivered) still reads."""
    checkpoint = tmp_path / "ckpt-1.index"
    checkpoint.write_bytes(b"weights")
    written = [
        LogMetrics({"train_loss": 0.9}, 1, 1_700_000_000_000),
        LogArtifact(str(checkpoint), "checkpoints"),
        End(None, False),
    ]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    kept = journal.Journal(str(run_dir), "run-id", "sqlite:///mlflow.db")
    for operation in written:
        kept.append(operation.op, journal_args(operation))
    kept.append("log_metrics", {"metrics": {"test_loss": 0.7}, "step": 1})
    kept.close()

    header, records = journal.pending(str(run_dir))
    assert header == journal.Header("run-id", "sqlite:///mlflow.db")
    read = [from_journal(record.op, record.args) for record in records]
    copy = run_dir / journal.ARTIFACTS_DIR / "2" / "ckpt-1.index"
    assert read == [written[0], LogArtifact(str(copy), "checkpoints"), written[2], LogMetrics({"test_loss": 0.7}, 1)]
    assert copy.read_bytes() == b"weights"

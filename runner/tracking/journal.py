"""The run directory's journal: what a run handed to MLflow, kept on disk until the tracking store has it.

The tracker process (runner.tracking.tracker_process) appends every metric, text, artifact, dataset input and
the run's end to `<run dir>/mlflow_journal.jsonl` as it arrives, copies each artifact file into
`<run dir>/mlflow_journal/<record>/`, and delivers the records in order from there; after each one it writes its
number to `mlflow_journal.delivered`. So whatever stops the delivery (a tracking server that does not answer, a
process killed with kill -9) leaves the undelivered records in the run directory, and the next invocation in
that directory (runner.tracking.mlflow_tracker.MlflowTracker.start) or `python -m runner.tracking.replay <run
dir>` delivers them. Every record is safe to deliver twice (a record delivered just before a kill may not have
been marked): metrics are logged once per (key, step), artifacts and texts overwrite themselves.

No MLflow here: plain files, read and written by the tracker process and the replay command.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

JOURNAL_FILE = "mlflow_journal.jsonl"
ARTIFACTS_DIR = "mlflow_journal"  # one folder per log_artifact record: <seq>/<file name>
DELIVERED_FILE = "mlflow_journal.delivered"
FORMAT = 1


@dataclass(frozen=True)
class Record:
    seq: int
    op: str  # an MlflowTracker.apply operation: log_metrics, system_metrics, log_text, log_artifact, log_inputs, end
    args: dict[str, Any]


@dataclass(frozen=True)
class Header:
    run_id: str
    tracking_uri: str


def _json_default(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else str(value)  # numpy scalars


class Journal:
    """One invocation's journal: appended to by any thread, read in order by one delivering thread."""

    def __init__(self, run_dir: str, run_id: str, tracking_uri: str):
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, JOURNAL_FILE)
        self.condition = threading.Condition()
        self.last_seq = 0  # the last record appended
        self.delivered_seq = 0  # every record up to this one is delivered (or was refused for good)
        remove(run_dir)  # whatever an earlier invocation left has been delivered by now (MlflowTracker.start)
        self._writer = open(self.path, "w", encoding="utf-8")
        self._write({"journal": FORMAT, "run_id": run_id, "tracking_uri": tracking_uri})
        self._reader = open(self.path, "rb")
        self._reader.readline()  # the header

    def _write(self, entry: dict[str, Any]) -> None:
        # One write per line, flushed: a process killed in between leaves whole lines (and at worst a torn last
        # one, which a reader ignores).
        self._writer.write(json.dumps(entry, default=_json_default) + "\n")
        self._writer.flush()

    def append(self, op: str, args: dict[str, Any]) -> int:
        """Journal a record and return its number. A log_artifact record's file is copied first (a checkpoint
        file may be rotated away before the server takes it); OSError if it cannot be read."""
        with self.condition:
            seq = self.last_seq + 1
            if op == "log_artifact":
                folder = os.path.join(self.run_dir, ARTIFACTS_DIR, str(seq))
                os.makedirs(folder, exist_ok=True)
                copy = os.path.join(folder, os.path.basename(args["path"]))
                shutil.copyfile(args["path"], copy)
                args = {**args, "path": os.path.relpath(copy, self.run_dir)}
            self._write({"seq": seq, "op": op, "args": args})
            self.last_seq = seq
            self.condition.notify_all()
        return seq

    def next(self, stop: threading.Event) -> Record | None:
        """The next record to deliver, waiting for one to be appended; None once `stop` is set."""
        with self.condition:
            while not stop.is_set():
                position = self._reader.tell()
                line = self._reader.readline()
                if line.endswith(b"\n"):
                    return _record(json.loads(line), self.run_dir)
                self._reader.seek(position)  # not a whole line yet: read it again once it is
                self.condition.wait(0.5)
        return None

    def delivered(self, record: Record) -> None:
        _mark(self.run_dir, record)
        with self.condition:
            self.delivered_seq = record.seq
            self.condition.notify_all()

    def close(self) -> None:
        """Stop writing; the files stay (remove() deletes them once everything is delivered)."""
        with self.condition:
            self._writer.close()
            self._reader.close()


def _record(entry: dict[str, Any], run_dir: str) -> Record:
    args = dict(entry["args"])
    if entry["op"] == "log_artifact":
        args["path"] = os.path.join(run_dir, args["path"])
    return Record(entry["seq"], entry["op"], args)


def _mark(run_dir: str, record: Record) -> None:
    """Record that `record` is delivered: its number on disk (replaced atomically), its artifact copy gone."""
    path = os.path.join(run_dir, DELIVERED_FILE)
    with open(path + ".tmp", "w") as handle:
        handle.write(f"{record.seq}\n")
    os.replace(path + ".tmp", path)
    if record.op == "log_artifact":
        shutil.rmtree(os.path.dirname(record.args["path"]), ignore_errors=True)


def pending(run_dir: str) -> tuple[Header | None, list[Record]]:
    """The journal's header and its records not yet delivered, in order; (None, []) without a journal."""
    path = os.path.join(run_dir, JOURNAL_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.readlines()
    except FileNotFoundError:
        return None, []
    if not lines or not lines[0].endswith("\n"):  # killed while writing its header: nothing in it yet
        return None, []
    first = json.loads(lines[0])
    header = Header(first["run_id"], first["tracking_uri"])
    try:
        with open(os.path.join(run_dir, DELIVERED_FILE)) as handle:
            delivered = int(handle.read().strip() or 0)
    except FileNotFoundError:
        delivered = 0
    records = [_record(json.loads(line), run_dir) for line in lines[1:] if line.endswith("\n")]
    return header, [record for record in records if record.seq > delivered]


def replay(run_dir: str, apply: Callable[[str, dict[str, Any]], None]) -> int:
    """Deliver what an earlier invocation left in run_dir's journal through `apply` (MlflowTracker.apply), in
    order, marking each; then remove the journal. Returns how many records were delivered. An error of `apply`
    propagates with the records from the failed one on still in the journal."""
    _, records = pending(run_dir)
    for record in records:
        apply(record.op, record.args)
        _mark(run_dir, record)
    remove(run_dir)
    return len(records)


def remove(run_dir: str) -> None:
    for name in (JOURNAL_FILE, DELIVERED_FILE, DELIVERED_FILE + ".tmp"):
        try:
            os.remove(os.path.join(run_dir, name))
        except FileNotFoundError:
            pass
    shutil.rmtree(os.path.join(run_dir, ARTIFACTS_DIR), ignore_errors=True)

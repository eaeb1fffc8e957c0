"""runner.outcome: the one file through which a process tells its supervisor how it ended."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from helpers.waiting import exited, wait_for
from runner import outcome
from runner.outcome import FAILED, FINISHED, KILLED, Outcome


def test_an_outcome_reads_back_as_written(tmp_path):
    file = str(tmp_path / "outcome.json")
    for written in (
        Outcome(FINISHED, metrics={"test_accuracy": 0.875, "train_loss": 0.25}, run_id="abc", task="worker 1"),
        Outcome(FAILED, 2, "error: dataset.dir='/no/such' does not exist. Fix: point it at the data."),
        Outcome(KILLED, 143, "preempted: received SIGTERM (resume: re-run the same command)", resumable=True),
    ):
        outcome.write(file, written)
        assert outcome.read(file, 99) == written  # the file's exit code, not the caller's guess
    assert os.listdir(tmp_path) == ["outcome.json"]  # no temporary file left behind
    assert outcome.read(file, 143).message == "received SIGTERM (resume: re-run the same command)"


def test_a_status_outside_the_three_is_refused(tmp_path):
    with pytest.raises(ValueError, match="RUNNING"):
        outcome.write(str(tmp_path / "outcome.json"), Outcome("RUNNING"))


@pytest.mark.parametrize(
    "content",
    [None, "", '{"status": "FINISHED", "exit_c', "[1, 2]", '{"status": "DONE"}', '{"status": "FAILED", "x": 1}'],
    ids=["missing", "empty", "cut", "not-an-object", "unknown-status", "unknown-field"],
)
def test_a_missing_or_garbled_file_says_the_process_wrote_no_outcome(tmp_path, content):
    file = tmp_path / "outcome.json"
    if content is not None:
        file.write_text(content)
    ended = outcome.read(str(file), -9, who="worker 1")
    assert (ended.status, ended.exit_code, ended.resumable, ended.metrics) == (FAILED, -9, False, {})
    assert ended.paragraph == (
        f"error: worker 1 was killed by SIGKILL and wrote no outcome ({file}): it was killed, or died before it "
        "could say why."
    )
    assert outcome.read(str(file), 3).message.startswith("the process ended with status 3 and wrote no outcome")


def test_the_path_is_the_supervisors_else_the_run_directorys():
    assert outcome.path("/runs/r", environ={}) == "/runs/r/outcome.json"
    assert outcome.path("/runs/r", "ps", 1, environ={}) == "/runs/r/outcome-ps-1.json"
    asked = {outcome.OUTCOME_VARIABLE: "/elsewhere/task.json"}
    assert outcome.path("/runs/r", "ps", 1, environ=asked) == "/elsewhere/task.json"


def test_a_reader_never_sees_half_a_file(tmp_path):
    """A process rewrites a large outcome as fast as it can while this one reads it: every read is whole."""
    file = str(tmp_path / "outcome.json")
    metrics = {f"metric_{index}": index / 7 for index in range(3000)}
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from runner import outcome; metrics = {f'metric_{i}': i / 7 for i in range(3000)}\n"
            "while True: outcome.write(sys.argv[1], outcome.Outcome('FINISHED', metrics=metrics))",
            file,
        ],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        wait_for(lambda: os.path.exists(file), 60, "the first outcome", every=0.01, unless=exited(writer, "the writer"))
        reads = 0
        stop = time.monotonic() + 2
        while time.monotonic() < stop:
            ended = outcome.read(file, 1)
            assert ended.status == FINISHED and ended.metrics == metrics, ended.paragraph
            reads += 1
        assert reads > 20
    finally:
        writer.kill()
        writer.wait()

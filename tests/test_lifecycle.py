"""A run's lifecycle (runner.tracking.lifecycle) on a real MLflow store: however a job's work ends, its run ends
with the right status, and a failing clean-up step is reported, never the reason a run stays open."""

from __future__ import annotations

import logging

import pytest

from helpers.config import mlflow_settings
from helpers.tracking import mlflow_client
from runner.errors import Preempted, RunnerError
from runner.tracking.lifecycle import RunLifecycle
from runner.tracking.mlflow_tracker import MlflowTracker


@pytest.fixture
def tracker(tmp_path):
    tracker = MlflowTracker(mlflow_settings(f"sqlite:///{tmp_path / 'mlflow.db'}"))
    tracker.start(str(tmp_path), {"batch": 64})
    return tracker


def _run(tracker):
    return mlflow_client(tracker.tracking_uri).get_run(tracker.run_id)


def test_a_block_that_ends_normally_finishes_the_run(tracker):
    with RunLifecycle(tracker):
        pass
    assert _run(tracker).info.status == "FINISHED"


def test_a_failing_clean_up_is_reported_and_the_run_still_ends_failed_with_its_own_error(tracker, caplog):
    """As when the registry refuses a registration (403) and then the deletion of the run's model (403 again)."""

    def discard_model():
        raise PermissionError("403 Forbidden: may not delete the model")

    with caplog.at_level(logging.WARNING, logger="runner"), pytest.raises(PermissionError, match="register"):
        with RunLifecycle(tracker, discard_model):
            raise PermissionError("403 Forbidden: may not register")
    run = _run(tracker)
    assert run.info.status == "FAILED"
    assert "may not register" in run.data.tags["error"]
    assert any(
        "discarding the model" in record.getMessage() and "may not delete" in record.getMessage()
        for record in caplog.records
    )


def test_a_preemption_ends_killed_and_resumable_with_the_explained_words(tracker):
    def explain(error):
        return Preempted("stopped by SIGTERM after saving ckpt-3") if isinstance(error, Preempted) else error

    with pytest.raises(Preempted, match="after saving ckpt-3"):
        with RunLifecycle(tracker, explain=explain):
            raise Preempted("received SIGTERM")
    run = _run(tracker)
    assert (run.info.status, run.data.tags["resumable"]) == ("KILLED", "true")
    assert "after saving ckpt-3" in run.data.tags["error"]


def test_an_explained_error_replaces_the_original_in_the_run_and_for_the_caller(tracker):
    def explain(error):
        return RunnerError("another task of the cluster failed. Fix: restart it.")

    with pytest.raises(RunnerError, match="another task") as raised:
        with RunLifecycle(tracker, explain=explain):
            raise ConnectionError("socket closed")
    assert raised.value.__suppress_context__
    assert "another task" in _run(tracker).data.tags["error"]


def test_a_long_error_keeps_its_start_and_its_last_line_in_the_tag(tracker):
    """A TensorFlow op error puts the op's traceback first and its own words last; how long the traceback is
    depends on where the packages are installed, so the tag keeps the end of the message, not only its start."""
    traceback = "".join(f'  File "/a/long/install/prefix/site-packages/module_{n}.py", line {n}\n' for n in range(200))
    message = f"Graph execution error:\n{traceback}indices[3] = 206 is not in [0, 64)"
    with pytest.raises(ValueError), RunLifecycle(tracker):
        raise ValueError(message)
    tag = _run(tracker).data.tags["error"]
    assert len(message) > len(tag)
    assert tag.startswith("ValueError: Graph execution error:")
    assert tag.endswith("206 is not in [0, 64)")
    assert "characters left out" in tag

"""What is written to one existing MLflow run, by its id: metrics (each (metric, step) once), texts, artifacts, dataset
inputs, system-metric samples and the run's end status; a journal's records delivered to it.

Uses MlflowClient with an explicit run id (no fluent global state), so several writers can live in one process.
MlflowTracker (runner.tracking.mlflow_tracker) writes through one, the tracker child's delivery thread too, and so
do `python -m runner.tracking.replay` and the local cluster's supervisor, which create no run.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from mlflow.data.schema import TensorDatasetSchema
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.types import Schema, TensorSpec

from runner.tracking import journal, operations
from runner.tracking.lifecycle import ERROR_TAG, RESUMABLE_TAG
from runner.tracking.operations import (
    End,
    LogArtifact,
    LogInputs,
    LogMetrics,
    LogText,
    Operation,
    SetTags,
    SystemMetrics,
)
from runner.tracking.session import millis
from runner.tracking.store import open_client

log = logging.getLogger("runner")

_MAX_PARAMS_PER_BATCH = 100
# MLflow's tag for the role a dataset played in a run ("training", "evaluation").
DATASET_CONTEXT_TAG = "mlflow.data.context"
_DATASET_INSERT_ATTEMPTS = 5


class RunWriter:
    def __init__(self, client: MlflowClient):
        self.client = client
        self.run_id: str | None = None
        self._logged: set[tuple[str, int]] = set()
        # Every metric of the run as attach() found it: {key: [(step, value), ...]} (empty for a new run).
        self.history_at_start: dict[str, list[tuple[int, float]]] = {}

    @property
    def _run_id(self) -> str:
        if self.run_id is None:
            raise RuntimeError("the MLflow tracker has no run yet: start() or attach() one first")
        return self.run_id

    def attach(self, run_id: str) -> None:
        """Write to the existing run `run_id`, knowing which (metric, step) it holds already."""
        self.run_id = run_id
        self.history_at_start = self.metric_histories()
        self._logged = {(key, step) for key, points in self.history_at_start.items() for step, _ in points}

    def created(self, run_id: str) -> None:
        """Write to `run_id`, a run just created: it holds nothing yet."""
        self.run_id = run_id
        self.history_at_start, self._logged = {}, set()

    def deliver_journal(self, run_dir: str) -> None:
        """Deliver whatever an earlier invocation left undelivered in run_dir's journal, before anything new."""
        replayed = journal.replay(run_dir, self.apply)
        if replayed:
            log.info(
                "delivered %d record(s) that an earlier invocation left in %s to MLflow run %s",
                replayed,
                os.path.join(run_dir, journal.JOURNAL_FILE),
                self.run_id,
            )
            self.attach(self._run_id)

    def apply(self, op: str, args: Mapping[str, Any]) -> None:
        """Deliver one record of the run's journal (runner.tracking.journal)."""
        self.deliver(operations.from_journal(op, args))

    def deliver(self, operation: Operation) -> None:
        """Log one operation of the run (runner.tracking.operations)."""
        match operation:
            case LogMetrics():
                self.log_metrics(operation.metrics, operation.step, operation.timestamp)
            case SystemMetrics():
                self.log_system_metrics(operation.metrics, operation.step, operation.timestamp)
            case LogText():
                self.client.log_text(self._run_id, operation.text, operation.artifact_file)
            case LogArtifact():
                self.client.log_artifact(self._run_id, operation.path, operation.artifact_path)
            case SetTags():
                for key, value in operation.tags.items():
                    self.client.set_tag(self._run_id, key, value)
            case LogInputs():
                self.log_inputs(operation.descriptions)
            case End():
                self.end(operation.message, operation.resumable)
            case _:
                operations.unhandled(operation)

    def log_params(self, values: Mapping[str, str]) -> None:
        items = [Param(key, value) for key, value in values.items()]
        for start in range(0, len(items), _MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self._run_id, params=items[start : start + _MAX_PARAMS_PER_BATCH])

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp: int | None = None) -> None:
        """Log each (metric, step) once: a resumed run re-trains an epoch it may have logged already.
        `timestamp` (milliseconds): when it was measured, if not now (a journaled record delivered later)."""
        now = millis() if timestamp is None else timestamp
        fresh = [Metric(k, float(v), now, step) for k, v in metrics.items() if (k, step) not in self._logged]
        if fresh:
            self.client.log_batch(self._run_id, metrics=fresh)
            self._logged.update((metric.key, step) for metric in fresh)

    def log_system_metrics(self, metrics: Mapping[str, float], step: int, timestamp: int) -> None:
        self.client.log_batch(
            self._run_id, metrics=[Metric(key, float(value), timestamp, step) for key, value in metrics.items()]
        )

    def log_inputs(self, descriptions: Sequence[Mapping[str, Any]]) -> None:
        """The run's data as MLflow dataset inputs (see runner.data.describe), each once: a resumed run, or a sweep
        job run again, finds them already there.

        Runs that start together (a sweep's jobs) log the same dataset at once: MLflow's store looks the
        dataset up, then inserts it, and all but one such insert break its unique key, which rolls back that
        call whole. The losers try again, and then find the dataset there."""
        for attempt in range(1, _DATASET_INSERT_ATTEMPTS + 1):
            try:
                return self._log_fresh_inputs(descriptions)
            except MlflowException as error:
                if attempt == _DATASET_INSERT_ATTEMPTS or not _lost_an_insert_race(error):
                    raise
                time.sleep(0.1 * attempt)

    def _log_fresh_inputs(self, descriptions: Sequence[Mapping[str, Any]]) -> None:
        run = self.client.get_run(self._run_id)
        logged = {
            (
                item.dataset.name,
                item.dataset.digest,
                next((tag.value for tag in item.tags if tag.key == DATASET_CONTEXT_TAG), None),
            )
            for item in (run.inputs.dataset_inputs if run.inputs else [])
        }
        fresh = [
            DatasetInput(_dataset_entity(description), tags=[InputTag(DATASET_CONTEXT_TAG, description["context"])])
            for description in descriptions
            if (description["name"], description["digest"], description["context"]) not in logged
        ]
        if fresh:
            self.client.log_inputs(self._run_id, datasets=fresh)

    def metric_histories(self) -> dict[str, list[tuple[int, float]]]:
        """Every metric of the run as (step, value) pairs in step order, across resumed invocations."""
        run_id = self._run_id
        run = self.client.get_run(run_id)
        return {
            key: sorted((m.step, m.value) for m in self.client.get_metric_history(run_id, key))
            for key in run.data.metrics
        }

    def running(self) -> None:
        """A continued run is RUNNING again, and not resumable while it is."""
        self.client.update_run(self._run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        self.client.set_tag(self._run_id, RESUMABLE_TAG, "false")

    def end(self, message: str | None, resumable: bool = False) -> None:
        """FINISHED without a message; KILLED and tagged resumable; FAILED with the message as its error tag
        (see runner.tracking.lifecycle.failure_message)."""
        if self.run_id is None:
            return
        if message is None:
            self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FINISHED))
            return
        if resumable:
            self.client.set_tag(self.run_id, RESUMABLE_TAG, "true")
            self.client.set_tag(self.run_id, ERROR_TAG, error_tag_text(message))
            self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.KILLED))
            return
        end_failed(self.client, self.run_id, message)


ERROR_TAG_LENGTH = 5000  # within MLflow's limit on a tag's value (8,000 characters) with room for a mark


def error_tag_text(error: str) -> str:
    """`error` as its tag keeps it: whole when short, else its start and its end. A TensorFlow op error puts the
    traceback of the op first and its own message (the bad index, the shape) last, and the last part is what a
    reader needs; how long the traceback is depends on where the packages are installed."""
    if len(error) <= ERROR_TAG_LENGTH:
        return error
    mark = "\n[... {} characters left out ...]\n"
    head = ERROR_TAG_LENGTH // 4
    tail = ERROR_TAG_LENGTH - head - len(mark.format(len(error)))
    return error[:head] + mark.format(len(error) - head - tail) + error[-tail:]


def end_failed(client: MlflowClient, run_id: str, error: str, keep_own_error: bool = False) -> None:
    """The one way a run is ended FAILED: `error` (its start and its end when long, see error_tag_text) in its
    `error` tag, then the status.
    With `keep_own_error`, a run that its own process already ended FAILED with an error keeps that error (the
    supervisor's word on it would say less)."""
    if keep_own_error:
        run = client.get_run(run_id)
        if run.info.status == RunStatus.to_string(RunStatus.FAILED) and run.data.tags.get(ERROR_TAG):
            return
    client.set_tag(run_id, ERROR_TAG, error_tag_text(error))
    client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))


def fail_run(tracking_uri: str | None, run_dir: str, run_id: str, message: str, only_if_running: bool = False) -> None:
    """End run_dir's run `run_id` FAILED with `message` for the process that tracked it, which is gone and cannot (a
    local cluster's chief): what that process left in the run directory's journal is delivered first. With
    `only_if_running`, a run that process ended itself (KILLED and resumable after a SIGTERM) keeps its end."""
    writer = RunWriter(open_client(tracking_uri))
    if only_if_running and writer.client.get_run(run_id).info.status != RunStatus.to_string(RunStatus.RUNNING):
        return
    writer.attach(run_id)
    writer.deliver_journal(run_dir)
    writer.running()  # not resumable: the run's end is this failure
    writer.end(message)


def _lost_an_insert_race(error: MlflowException) -> bool:
    """Whether an MLflow store refused an insert for a unique key another process had just taken (sqlite's
    and PostgreSQL's wording, also when a tracking server passes it on)."""
    text = str(error)
    return "UNIQUE constraint failed" in text or "duplicate key value violates unique constraint" in text


def _dataset_entity(description: Mapping[str, Any]) -> Dataset:
    """An MLflow dataset entity from a description, as mlflow.data.from_numpy would make it from the arrays
    (same schema and profile fields), without the arrays."""
    features, targets = description["features"], description["targets"]

    def spec(part: Mapping[str, Any]) -> Schema:
        return Schema([TensorSpec(np.dtype(part["dtype"]), (-1, *part["shape"][1:]))])

    profile = {
        "features_shape": features["shape"],
        "features_size": int(np.prod(features["shape"])),
        "features_nbytes": features["nbytes"],
        "targets_shape": targets["shape"],
        "targets_size": int(np.prod(targets["shape"])),
        "targets_nbytes": targets["nbytes"],
    }
    return Dataset(
        name=description["name"],
        digest=description["digest"],
        source_type=description["source_type"],
        source=json.dumps(description["source"]),
        schema=json.dumps(TensorDatasetSchema(spec(features), spec(targets)).to_dict()),
        profile=json.dumps(profile),
    )

"""`python -m runner.tracking.replay <run dir> [<run dir> ...]`: deliver to MLflow what a run left in its journal.

A process that ends while its tracking server does not answer (past `mlflow.outage_seconds`, or killed) leaves the
records the server has not taken in `<run dir>/mlflow_journal.jsonl` (runner.tracking.journal). Re-running the
same command with the same hydra.run.dir delivers them first; this command delivers them without training, to
the store the journal names (or `--tracking-uri`), in order, each metric once, and then removes the journal.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import urllib.request

from runner.config.checks import refuse_credentials_in_uri
from runner.errors import RunnerError
from runner.run_lock import hold
from runner.tracking import journal
from runner.tracking.run_writer import RunWriter
from runner.tracking.store import open_client
from runner.verbosity import configure


def replay_run_dir(run_dir: str, tracking_uri: str | None = None) -> int:
    """Deliver run_dir's journal; the number of records delivered (0 without a journal)."""
    if not os.path.isdir(run_dir):
        raise RunnerError(
            f"{run_dir!r} is not a directory. Fix: pass a run directory (the hydra.run.dir of the run, "
            "which holds mlflow_run_id.txt and mlflow_journal.jsonl)."
        )
    header, records = journal.pending(run_dir)
    if header is None:
        print(f"{run_dir}: no {journal.JOURNAL_FILE}, nothing to deliver")
        return 0
    hold(os.path.abspath(run_dir))  # not while a run trains there: it delivers the journal itself
    uri = tracking_uri or header.tracking_uri
    refuse_credentials_in_uri("--tracking-uri", uri)
    _check_answers(uri, run_dir)
    # Only the store and the run matter here: the journal holds the run's own records (no new run, no params).
    writer = RunWriter(open_client(uri))
    try:
        writer.client.get_run(header.run_id)
    except Exception as error:
        raise RunnerError(
            f"{run_dir}'s journal belongs to MLflow run {header.run_id}, which the store {uri} does not have "
            f"({type(error).__name__}: {str(error)[:200]}). Fix: pass the store the run was tracked in, "
            "--tracking-uri=<its mlflow.tracking_uri>."
        ) from None
    writer.attach(header.run_id)
    try:
        count = journal.replay(run_dir, writer.apply)
    except Exception as error:
        _, left = journal.pending(run_dir)
        raise RunnerError(
            f"delivering {run_dir}'s journal to MLflow run {header.run_id} at {uri} stopped with {len(left)} "
            f"record(s) left ({type(error).__name__}: {str(error)[:300]}). Fix: once the store answers, run this "
            "command again: it goes on from there."
        ) from None
    status = writer.client.get_run(header.run_id).info.status
    print(
        f"{run_dir}: delivered {count} record(s) to MLflow run {header.run_id} at {uri}; the run is {status}"
        + (" (resume it: re-run the same command with the same hydra.run.dir)" if status != "FINISHED" else "")
    )
    return count


def _check_answers(uri: str, run_dir: str) -> None:
    if not uri.startswith(("http://", "https://")):
        return
    health = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(health, timeout=10) as response:
            response.read()
    except OSError as error:
        raise RunnerError(
            f"the tracking server {uri} that {run_dir}'s journal is for does not answer ({health}: "
            f"{getattr(error, 'reason', error)}). Fix: start it (docs/team-server.md) and run this command again, "
            "or pass --tracking-uri=<where it runs now>; the journal stays as it is."
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner.tracking.replay",
        description="Deliver to MLflow what a run left undelivered in <run dir>/mlflow_journal.jsonl.",
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run directory (hydra.run.dir)")
    parser.add_argument(
        "--tracking-uri", default=None, help="the store to deliver to (default: the one the run was tracked in)"
    )
    args = parser.parse_args(argv)
    configure(verbose=False)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        for run_dir in args.run_dirs:
            replay_run_dir(run_dir, args.tracking_uri)
    except RunnerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Opening the MLflow tracking store, safely when several processes open a fresh one at once.

MLflow creates a sqlite store's tables and runs its schema migrations in the first process that opens the
file; two processes doing it together fail ("duplicate column name: step", "table ... already exists"),
and a third that opens the file between the two steps finds an out-of-date schema. open_client opens a
sqlite store while holding an exclusive lock on `<database file>.lock` (filelock, an flock(2) lock: it holds
across processes, on a shared file system with working locks too, and the kernel drops it if its holder
dies), so the first process creates and migrates the store and the others wait for it, then find it ready.
A server or database URI needs no lock: the server, or the database, serialises its own schema changes.
"""

from __future__ import annotations

import os

from filelock import FileLock, Timeout
from mlflow import get_tracking_uri
from mlflow.tracking import MlflowClient
from sqlalchemy.engine.url import make_url

from runner.errors import RunnerError

# Creating and migrating a store takes a few seconds; waiting this long means its holder is stuck.
LOCK_SECONDS = 600.0


def sqlite_file(tracking_uri: str) -> str | None:
    """The database file of a sqlite:/// URI (None for any other store, or an in-memory database)."""
    if not tracking_uri.startswith("sqlite:"):
        return None
    database = make_url(tracking_uri).database
    return None if not database or database == ":memory:" else os.path.abspath(database)


def absolute_tracking_uri(tracking_uri: str, base: str | None = None) -> str:
    """`tracking_uri` with a sqlite file's relative path made absolute, from `base` (default: the current
    directory): the same store wherever it is read from. Any other URI as it is."""
    database = make_url(tracking_uri).database if tracking_uri.startswith("sqlite:") else None
    if not database or database == ":memory:" or os.path.isabs(database):
        return tracking_uri
    absolute = os.path.abspath(os.path.join(base or os.getcwd(), database))
    return make_url(tracking_uri).set(database=absolute).render_as_string(hide_password=False)


def open_client(tracking_uri: str | None) -> MlflowClient:
    """An MlflowClient for tracking_uri (None: MLflow's default) whose store exists and is migrated."""
    tracking_uri = tracking_uri or get_tracking_uri()
    database = sqlite_file(tracking_uri)
    if database is None:
        return MlflowClient(tracking_uri=tracking_uri)
    os.makedirs(os.path.dirname(database), exist_ok=True)
    lock = FileLock(database + ".lock", timeout=LOCK_SECONDS)
    try:
        with lock:
            client = MlflowClient(tracking_uri=tracking_uri)  # creates and migrates a new store
            client.search_experiments(max_results=1)
    except Timeout:
        raise RunnerError(
            f"the MLflow store {database} stayed locked for {LOCK_SECONDS:.0f} s by another process creating or "
            f"migrating it ({lock.lock_file}). Fix: find that process (fuser {lock.lock_file}) and stop it if it "
            "is stuck, then re-run; or point mlflow.tracking_uri at another store."
        ) from None
    return client

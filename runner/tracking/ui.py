"""Where the MLflow UI shows a job's runs: the link the log prints, and the experiment tag that makes MLflow 3's UI
open an experiment as model training."""

from __future__ import annotations

# MLflow's own experiment tag that its UI reads to open an experiment as model training (the runs table), not
# in its GenAI mode ("Traces"), which MLflow 3's UI otherwise picks.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# mlflow ui's default address, for a store that no server serves.
UI_ADDRESS = "http://127.0.0.1:5000"


def ui_link(tracking_uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """Where to see the experiment's runs table (and the run `run_id`) in the MLflow UI, for the log: the
    server's own pages, or for a store without a server the `mlflow ui` command that serves it and the page
    at its default address. `?workflowType=machine_learning` opens the runs table, not MLflow 3's GenAI view."""
    if tracking_uri.startswith(("http://", "https://")):
        address, how = tracking_uri.rstrip("/"), ""
    else:
        address = UI_ADDRESS
        store = tracking_uri if tracking_uri.startswith("sqlite:") else "<the store of mlflow.tracking_uri>"
        how = f"`mlflow ui --backend-store-uri {store}`, then "
    table = f"{address}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
    run = f" (the run: {address}/#/experiments/{experiment_id}/runs/{run_id})" if run_id else ""
    return f"{how}{table}{run}"

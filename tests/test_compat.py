"""The private names of MLflow, tqdm, TensorFlow, Hydra and Optuna that runner/compat/ relies on: each test fails,
naming the library and its installed version, when the internal it checks has changed; and no module outside
runner/compat/ uses a private name of a library."""

from __future__ import annotations

import inspect
import io
import threading
from importlib.metadata import version
from pathlib import Path

from helpers.tracking import mlflow_client


def _changed(library: str, what: str, module: str) -> str:
    return (
        f"{library} {version(library)} changed {what}, which runner/compat/{module} relies on: adapt that module to "
        "this version, or pin the versions it was written against"
    )


def test_mlflows_system_metrics_monitor_has_what_the_runner_uses(tmp_path):
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    from runner.compat import mlflow_internals

    parameters = inspect.signature(SystemMetricsMonitor.__init__).parameters
    missing = [name for name in mlflow_internals.MONITOR_ARGUMENTS if name not in parameters]
    assert not missing, _changed("mlflow", f"SystemMetricsMonitor's arguments ({missing} gone)", "mlflow_internals.py")

    client = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("compat")).info.run_id
    samples: list[tuple[dict[str, float], int]] = []
    published = threading.Event()

    def publish(metrics: dict[str, float], step: int) -> None:
        samples.append((metrics, step))
        published.set()

    monitor = mlflow_internals.system_metrics_monitor(
        publish, run_id, interval_seconds=0.1, tracking_uri=client.tracking_uri
    )
    missing = [name for name in mlflow_internals.MONITOR_ATTRIBUTES if not hasattr(monitor, name)]
    assert not missing, _changed("mlflow", f"SystemMetricsMonitor's attributes ({missing} gone)", "mlflow_internals.py")
    assert any(isinstance(each, CPUMonitor) for each in monitor.monitors), _changed(
        "mlflow", "SystemMetricsMonitor's monitors (no CPUMonitor)", "mlflow_internals.py"
    )
    monitor.start()
    try:
        assert published.wait(timeout=30), _changed(
            "mlflow", "SystemMetricsMonitor's sampling loop (no sample published)", "mlflow_internals.py"
        )
    finally:
        monitor.finish()
    metrics, step = samples[0]
    assert step == 0 and "system/cpu_utilization_percentage" in metrics, _changed(
        "mlflow", f"SystemMetricsMonitor's samples ({sorted(metrics)} at step {step})", "mlflow_internals.py"
    )


def test_tqdm_lists_the_bars_still_drawn_and_closing_them_ends_their_line():
    from tqdm import tqdm

    from runner.compat.tqdm_internals import close_open_bars

    out = io.StringIO()
    bar = tqdm(total=10, file=out)
    instances = getattr(tqdm, "_instances", None)
    assert instances is not None and bar in instances, _changed("tqdm", "tqdm._instances", "tqdm_internals.py")
    close_open_bars()
    assert bar not in tqdm._instances and out.getvalue().endswith("\n"), _changed(
        "tqdm", "closing a bar listed in tqdm._instances", "tqdm_internals.py"
    )


def test_mlflows_context_tags_and_git_source_are_where_the_runner_reads_them():
    from runner.compat import mlflow_internals

    try:
        tags = mlflow_internals.context_tags_without_git()
        commit, _, _ = mlflow_internals.git_source(str(Path(__file__).parent))
    except (ImportError, AttributeError, TypeError) as error:
        raise AssertionError(
            _changed("mlflow", f"resolve_tags, GitRunContext or git_utils ({error})", "mlflow_internals.py")
        ) from error
    assert "mlflow.user" in tags and "mlflow.source.type" in tags, _changed(
        "mlflow", f"the context tags resolve_tags returns ({sorted(tags)})", "mlflow_internals.py"
    )
    assert not any(key.startswith("mlflow.source.git") for key in tags), _changed(
        "mlflow", "resolve_tags(ignore=[GitRunContext])", "mlflow_internals.py"
    )
    assert commit is None or len(commit) == 40, _changed(
        "mlflow", f"get_git_commit ({commit!r})", "mlflow_internals.py"
    )


def test_mlflows_rest_helpers_and_the_uis_bulk_history_route_are_where_the_runner_reads_them():
    """runner.sweeps.report.histories reads a tracking server's histories in bulk through these (the read itself,
    through a real server, is tests/test_sweep_report.py's 500-run test)."""
    import mlflow.server
    from mlflow.utils import credentials, rest_utils

    from runner.compat import mlflow_internals

    parameters = set(inspect.signature(rest_utils.http_request).parameters)
    # `params` reaches requests through **kwargs, as MLflow's REST store passes it.
    assert {"host_creds", "endpoint", "method", "kwargs"} <= parameters, _changed(
        "mlflow", f"http_request's parameters ({sorted(parameters)})", "mlflow_internals.py"
    )
    assert callable(rest_utils.verify_rest_response) and callable(credentials.get_default_host_creds)
    routes = {str(rule) for rule in mlflow.server.app.url_map.iter_rules()}
    assert any(route.endswith(mlflow_internals.UI_BULK_HISTORY_ENDPOINT) for route in routes), _changed(
        "mlflow", f"the UI's route {mlflow_internals.UI_BULK_HISTORY_ENDPOINT}", "mlflow_internals.py"
    )
    assert mlflow_internals.ServerRequests("http://127.0.0.1:1").credentials.host == "http://127.0.0.1:1"


def test_tensorflows_retracing_counts_are_where_the_runner_forgets_them():
    import tensorflow as tf
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    from runner.compat.tf_internals import forget_tracing_counts

    manager = getattr(polymorphic_function, "_frequent_tracing_detector_manager", None)
    assert manager is not None and hasattr(manager, "_detectors") and hasattr(manager, "_lock"), _changed(
        "tensorflow", "its retracing counter (_frequent_tracing_detector_manager)", "tf_internals.py"
    )

    @tf.function
    def double(x):
        return 2 * x

    double(tf.constant(1.0))
    assert len(manager._detectors) > 0, _changed("tensorflow", "how it counts traces", "tf_internals.py")
    forget_tracing_counts()
    assert len(manager._detectors) == 0


def test_tensorflows_preemption_handler_and_checkpoint_state_are_where_the_runner_reads_them():
    import tensorflow as tf

    from runner.compat import tf_internals

    handler = tf.distribute.experimental.PreemptionCheckpointHandler
    for name in ("_stop_cluster_wise_termination_watcher_thread", "_stop_poll_termination_signal_thread"):
        assert callable(getattr(handler, name, None)), _changed("tensorflow", f"{name}", "tf_internals.py")
    assert "self._received_own_sigterm = " in inspect.getsource(handler), _changed(
        "tensorflow", "_received_own_sigterm", "tf_internals.py"
    )
    assert tf_internals.TERMINATED_WORKER_KEY in inspect.getsource(inspect.getmodule(handler)), _changed(
        "tensorflow", "the coordination key of the signalled task", "tf_internals.py"
    )
    state = tf_internals.CheckpointState(model_checkpoint_path="ckpt-2", all_model_checkpoint_paths=["ckpt-2"])
    assert list(state.all_model_checkpoint_paths) == ["ckpt-2"], _changed(
        "tensorflow", "CheckpointState", "tf_internals.py"
    )


def test_hydras_job_return_and_submitit_launchers_hold_what_the_runner_reads():
    from hydra.core.utils import JobReturn, JobStatus

    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher
    from runner.compat.hydra_internals import job_error, submitit_executor

    error = ValueError("the job's own error")
    assert job_error(JobReturn(status=JobStatus.FAILED, _return_value=error)) is error, _changed(
        "hydra-core", "JobReturn._return_value", "hydra_internals.py"
    )
    executors = (submitit_executor(LocalLauncher), submitit_executor(SlurmLauncher))
    assert executors == ("local", "slurm"), _changed("hydra-submitit-launcher", "_EXECUTOR", "hydra_internals.py")


def test_optunas_frozen_trial_holds_the_storage_id_the_runner_opens_a_live_trial_by():
    import optuna

    from runner.compat.optuna_internals import trial_id

    study = optuna.create_study()
    asked = study.ask()
    frozen = study.get_trials(deepcopy=False)[0]
    assert trial_id(frozen) == asked._trial_id, _changed("optuna", "FrozenTrial._trial_id", "optuna_internals.py")
    optuna.trial.Trial(study, trial_id(frozen)).report(0.5, 1)
    assert study.get_trials(deepcopy=False)[0].intermediate_values == {1: 0.5}


# Names that begin with an underscore and are public all the same: os._exit, and a namedtuple's own methods.
_PUBLIC_UNDERSCORE_NAMES = {"_exit", "_replace", "_asdict", "_fields", "_make"}


def test_no_module_outside_runner_compat_uses_a_private_name_of_a_library():
    """A private attribute (`x._name` on anything but self or cls), a private module (`a._b`, or TensorFlow's
    `tensorflow.python`) or a private name imported from a library: runner/compat/ alone may hold them, each pinned by
    a test above."""
    import ast

    root = Path(__file__).resolve().parents[1]
    found = []
    for path in sorted((root / "runner").rglob("*.py")):
        if "compat" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("__"):
                own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if not own and node.attr not in _PUBLIC_UNDERSCORE_NAMES:
                    found.append(f"{where} .{node.attr}")
            if isinstance(node, ast.ImportFrom | ast.Import):
                modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                for module in modules:
                    parts = module.split(".")
                    if parts[0] == "runner" or module == "__future__":
                        continue
                    if any(part.startswith("_") for part in parts) or module.startswith("tensorflow.python"):
                        found.append(f"{where} import {module}")
                if isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("runner"):
                    found += [
                        f"{where} {a.name}" for a in node.names if a.name.startswith("_") and a.name != "__future__"
                    ]
    assert not found, "private library names outside runner/compat/: " + "; ".join(found)

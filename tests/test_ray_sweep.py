"""Sweeps on a real Ray cluster (hydra/launcher=ray), started with `ray start --head` and stopped with `ray stop`.

Ray turns 127.0.0.1 into the machine's interface address and probes a public DNS server, so everything Ray
starts here runs in fresh network and PID namespaces holding only loopback (`unshare --net --pid`): nothing can
leave the machine, `ray stop` sees only the namespace's processes, and the kernel ends whatever is left when the
script does. Since the sweep must run in there too, one bash script runs the cluster, the sweeps and the stop,
and the tests read what it wrote (MLflow's sqlite store, the sweep directories, the commands' output).
"""

from __future__ import annotations

import csv
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from helpers.presets import TINY
from helpers.requires import requires
from runner.run_lock import LOCK_FILE
from runner.sweeps.report.summary import CSV_FILE, CURVES_FILE, JOBS_CSV_FILE, MARKDOWN_FILE
from runner.sweeps.terms import PARENT_RUN_ID_FILE

pytestmark = [pytest.mark.slow, requires("iproute2")]  # each command runs in its own network namespace

PORT = 6379  # the namespace has its own ports: nothing else can hold this one
SWEEP = [*TINY, "strategy=one_device", "hydra/launcher=ray"]
RAY = Path(sys.executable).with_name("ray")


def run_in_namespace(script: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """bash -c script as the first process of new network and PID namespaces with loopback up. --kill-child
    ends the namespace (and with it every process in it) if this side is stopped or times out."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    for name in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS"):
        env.pop(name, None)
    return subprocess.run(
        [
            "unshare",
            "--net",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "bash",
            "-c",
            "set -u\nip link set lo up\n" + script,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def runner_command(*overrides: str) -> str:
    return " ".join([sys.executable, "-m", "runner", "-m", *(f"'{item}'" for item in overrides)])


def read(path: Path) -> str:
    return path.read_text() if path.exists() else f"<{path.name} missing>"


@pytest.fixture(scope="module")
def ray_session(tmp_path_factory):
    """One Ray head for every case: a 3-job sweep on it (one job with a bad value), then, with the cluster
    stopped, a sweep at the address that no longer answers, then a 1-job sweep of two folds that starts its own Ray."""
    work = tmp_path_factory.mktemp("ray_sweeps")
    # Ray's temp directory holds its sockets, whose paths may not exceed 107 bytes: a short one of its own, not
    # pytest's (a worker's basetemp, /tmp/pytest-of-root/pytest-N/popen-gw1/, leaves too little room).
    head, temp = work / "head", Path(tempfile.mkdtemp(prefix="runner-ray-"))
    head.mkdir()
    address = f"hydra.launcher.ray.init.address=127.0.0.1:{PORT}"
    # HOME too, holding a Ray token as a machine where Ray ran before does (~/.ray/auth_token): the head then
    # turns token authentication on, and the sweep must join with the token.
    token = work / "home" / ".ray" / "auth_token"
    token.parent.mkdir(parents=True)
    token.write_text(secrets.token_hex(32))
    script = f"""
export RAY_TMPDIR={temp} HOME={work}/home
cd {head}  # the head starts elsewhere than the sweeps: its workers must still put jobs where the command ran
{RAY} start --head --port={PORT} --num-cpus=2 --temp-dir={temp} --include-dashboard=false \\
  --disable-usage-stats > {work}/ray_start.log 2>&1 || exit 90
ps -ww -eo args > {work}/ps_cluster.txt
cd {work}
{
        runner_command(
            *SWEEP,
            address,
            "batch=32,64,0",
            f"mlflow.tracking_uri=sqlite:///{work}/mlflow.db",
            "hydra.sweep.dir=cluster",
        )
    } > cluster.out 2> cluster.err
echo $? > cluster.rc
{RAY} stop --force > ray_stop.log 2>&1
{
        runner_command(
            *SWEEP, address, f"mlflow.tracking_uri=sqlite:///{work}/unreachable.db", "hydra.sweep.dir=unreachable"
        )
    } > unreachable.out 2> unreachable.err
echo $? > unreachable.rc
{
        runner_command(
            *SWEEP,
            "batch=32",
            "sweep.folds=2",
            f"mlflow.tracking_uri=sqlite:///{work}/local.db",
            "hydra.sweep.dir=local",
        )
    } > local.out 2> local.err
echo $? > local.rc
ps -ww -eo args > ps_end.txt
"""
    try:
        try:
            done = run_in_namespace(script, work, timeout=540)
        finally:
            # The namespace died with its script: no Ray process may have outlived it, anywhere on the machine.
            survivors = [
                line
                for line in subprocess.run(
                    ["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True
                ).stdout.splitlines()
                if str(temp) in line
            ]
        assert done.returncode == 0, (done.returncode, done.stderr[-3000:], read(work / "ray_start.log")[-3000:])
        yield work, survivors
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def client(work: Path, store: str) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{work}/{store}")


def sweep_runs(work: Path, store: str, sweep: str):
    """The sweep's parent run and its children by job number."""
    mlflow = client(work, store)
    parent = mlflow.get_run((work / sweep / PARENT_RUN_ID_FILE).read_text().strip())
    found = mlflow.search_runs([parent.info.experiment_id], f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent.info.run_id}'")
    return parent, sorted(found, key=lambda run: int(run.data.tags["job_number"]))


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


@pytest.mark.server
@requires("ray")
def test_a_sweep_runs_its_jobs_as_tasks_on_an_existing_cluster_and_isolates_a_failing_job(ray_session):
    work, _ = ray_session
    assert read(work / "cluster.rc").strip() == "1", read(work / "cluster.err")[-4000:]
    # The cluster's one node, as its raylet was started.
    [node_id] = set(re.findall(r"raylet/raylet .*?--node_id=([0-9a-f]+)", read(work / "ps_cluster.txt")))
    assert "Token authentication is enabled" in read(work / "ray_start.log")

    parent, jobs = sweep_runs(work, "mlflow.db", "cluster")
    assert parent.info.status == "FAILED" and parent.data.tags["swept_keys"] == "batch"
    assert [run.info.run_name for run in jobs] == ["batch=32", "batch=64", "batch=0"]
    assert [run.info.status for run in jobs] == ["FINISHED", "FINISHED", "FAILED"]
    for run in jobs:
        assert run.data.tags["launcher"] == "ray"
        assert run.data.tags["ray_node_id"] == node_id
    for run in jobs[:2]:
        assert 0.0 <= run.data.metrics["test_accuracy"] <= 1.0
    assert "batch=0 is not valid" in jobs[2].data.tags["error"]
    # Two CPUs, one per job: the two good jobs ran at once, as Ray tasks.
    (start0, end0), (start1, end1) = [(run.info.start_time, run.info.end_time) for run in jobs[:2]]
    assert start0 < end1 and start1 < end0

    # The jobs' directories are where the command ran, not where the Ray head was started.
    sweep_dir = work / "cluster"
    for number, run in enumerate(jobs):
        assert (sweep_dir / str(number) / "mlflow_run_id.txt").read_text().strip() == run.info.run_id
    assert not (work / "head" / "cluster").exists()

    # The summary: files, artifacts on the parent, and the failed job named in one paragraph.
    with open(sweep_dir / JOBS_CSV_FILE) as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["overrides"], row["status"]) for row in rows] == [
        ("batch=32", "FINISHED"),
        ("batch=64", "FINISHED"),
        ("batch=0", "FAILED"),
    ]
    assert (sweep_dir / MARKDOWN_FILE).exists() and (sweep_dir / CURVES_FILE).stat().st_size > 0
    artifacts = {item.path for item in client(work, "mlflow.db").list_artifacts(parent.info.run_id)}
    assert {CSV_FILE, JOBS_CSV_FILE, MARKDOWN_FILE, CURVES_FILE} <= artifacts
    [line] = error_lines(read(work / "cluster.err"))
    assert line.startswith("error: 1 of 3 sweep jobs failed: job 2 (batch=0): batch=0 is not valid")


@pytest.mark.server
@requires("ray")
def test_an_address_that_does_not_answer_is_one_paragraph_before_anything_starts(ray_session):
    work, _ = ray_session
    err = read(work / "unreachable.err")
    assert read(work / "unreachable.rc").strip() == "2", err[-3000:]
    assert "Traceback" not in err
    [line] = error_lines(err)
    assert line.startswith(
        f"error: hydra.launcher.ray.init.address=127.0.0.1:{PORT} does not answer (Connection refused"
    )
    assert f"ray start --head --port={PORT}" in line
    # Nothing was created for the sweep: no tracking store, no parent run.
    assert not (work / "unreachable.db").exists()
    assert not (work / "unreachable" / PARENT_RUN_ID_FILE).exists()


@pytest.mark.server
@requires("ray")
def test_without_an_address_the_sweep_starts_its_own_ray(ray_session):
    work, _ = ray_session
    assert read(work / "local.rc").strip() == "0", read(work / "local.err")[-4000:]
    parent, folds = sweep_runs(work, "local.db", "local")
    assert parent.info.status == "FINISHED"
    # sweep.folds=2: the job, one Ray task, trains its two folds as two child runs, one after the other in the one
    # warm worker of that Ray worker process (the pid that held each fold's directory).
    assert sorted(run.data.tags["fold"] for run in folds) == ["0", "1"]
    holders = {read(work / "local" / "0" / f"fold-{fold}" / LOCK_FILE).strip() for fold in (0, 1)}
    assert len(holders) == 1 and holders.pop().isdigit()
    for fold in (0, 1):
        log = read(work / "local" / "0" / f"fold-{fold}" / "runner.log")
        assert "s after the warm worker took the run" in log
    for run in folds:
        assert run.info.status == "FINISHED" and run.data.tags["launcher"] == "ray"
        assert re.fullmatch(r"[0-9a-f]{56}", run.data.tags["ray_node_id"])
    assert "Started a local Ray instance" in read(work / "local.err")


@pytest.mark.server
@requires("ray")
def test_no_ray_process_outlives_the_namespace(ray_session):
    work, survivors = ray_session
    assert survivors == []
    # Within the namespace, `ray stop` left no raylet or GCS server, and the sweep's own Ray ended with it.
    assert not re.search(r"raylet|gcs_server", read(work / "ps_end.txt"))


def test_the_launcher_without_its_extra_names_the_extra_to_install(tmp_path):
    # A truthful absence: the plugin's import fails as it would without the package (a None entry in
    # sys.modules makes `import hydra_plugins.hydra_ray_launcher` raise ImportError).
    shim = (
        "import runpy, sys; sys.modules['hydra_plugins.hydra_ray_launcher'] = None; "
        "runpy.run_module('runner', run_name='__main__', alter_sys=True)"
    )
    overrides = " ".join(
        f"'{item}'"
        for item in [*SWEEP, "batch=32,64", f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db", "hydra.sweep.dir=sweep"]
    )
    done = run_in_namespace(f'{sys.executable} -c "{shim}" -m {overrides}', tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: hydra/launcher=ray needs the optional extra 'ray'")
    assert "pip install 'hydra-tf-runner[ray]'" in line and "pip install -e '.[ray]'" in line
    assert not (tmp_path / "m.db").exists() and not (tmp_path / "sweep").exists()

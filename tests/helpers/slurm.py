"""A real one-node SLURM for the tests: Debian's slurmctld and slurmd in the foreground, configured in a
temporary directory (state, spool, logs, pid files) on free loopback ports, found by the clients
(`sbatch`, `srun`, `squeue`, `scontrol`, `scancel`) through SLURM_CONF.

No munge, cgroups or systemd: auth/none, proctrack/linuxproc, task/none and no accounting. The node
claims 4 CPUs (config_overrides) so that a job of 3 tasks fits on a 2-core machine. Stopping it cancels
every job, stops both daemons and kills whatever they started (slurmstepd and the job's processes
survive slurmd by design): each of those carries this SLURM's SLURM_CONF in its environment.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers.config import REPO
from helpers.preemption import checkpoints
from helpers.presets import TWO_EPOCHS
from helpers.processes import is_running
from helpers.waiting import exited, holds_within, wait_for
from runner.clusters.local import free_ports

INSTALL_HINT = (
    "install Debian's SLURM as .ci/run does: apt-get install -y --no-install-recommends slurmctld slurmd slurm-client"
)
SCRIPTS = REPO / "slurm"
MULTI_WORKER = SCRIPTS / "train_multi_worker.sbatch"
PARAMETER_SERVER = SCRIPTS / "train_parameter_server.sbatch"
# The states of a job that has not ended (squeue(1) "JOB STATE CODES"): SIGNALING while slurmctld delivers a
# `--signal`, COMPLETING while its processes exit, REQUEUED on its way back to PENDING.
JOB_STATES_NOT_ENDED = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "SIGNALING", "COMPLETING", "STAGE_OUT", "SUSPENDED", "REQUEUED", "RESIZING"}
)
# A job that ended stays visible to `scontrol show job` this long: there is no accounting to ask.
MIN_JOB_AGE_SECONDS = 3600


def free_port_run(count: int) -> int:
    """The first of `count` consecutive free loopback ports (SlurmClusterResolver's port_base + k)."""
    for _ in range(100):
        [base] = free_ports(1)
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sock.bind(("127.0.0.1", port))
                sockets.append(sock)
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports")


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return f"({path} not written)"


def _processes_with_environment(entry: bytes) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                if entry in handle.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return [pid for pid in found if is_running(pid)]


class Slurm:
    """slurmctld + slurmd of one node `localhost`, partition `debug`, in a temp directory."""

    def __init__(self, cpus: int = 4):
        for program in ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo"):
            if shutil.which(program) is None and not os.path.exists(f"/usr/sbin/{program}"):
                raise RuntimeError(f"{program} is not installed: {INSTALL_HINT}")
        self.root = Path(tempfile.mkdtemp(prefix="runner-slurm-"))
        self.conf = self.root / "slurm.conf"
        self.cpus = cpus
        self.controller: subprocess.Popen | None = None
        self.node: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        """The environment for SLURM's clients (and everything a job started through them runs)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_conf(self) -> None:
        controller_port, node_port = free_ports(2)
        for name in ("state", "spool"):
            (self.root / name).mkdir()
        self.conf.write_text(f"""\
ClusterName=runnertest
SlurmctldHost=localhost
SlurmctldPort={controller_port}
SlurmdPort={node_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge={MIN_JOB_AGE_SECONDS}
KillWait=10
StateSaveLocation={self.root / "state"}
SlurmdSpoolDir={self.root / "spool"}
SlurmctldPidFile={self.root / "slurmctld.pid"}
SlurmdPidFile={self.root / "slurmd.pid"}
SlurmctldLogFile={self.root / "slurmctld.log"}
SlurmdLogFile={self.root / "slurmd.log"}
NodeName=localhost CPUs={self.cpus} RealMemory=16000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES State=UP OverSubscribe=FORCE:4 MaxTime=INFINITE
""")

    def _daemon(self, *command: str, log: str) -> subprocess.Popen:
        with open(self.root / log, "wb") as output:
            return subprocess.Popen(
                list(command),
                env=self.env,
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def start(self, timeout: float = 60) -> Slurm:
        self._write_conf()
        self.controller = self._daemon("slurmctld", "-D", "-i", "-f", str(self.conf), log="slurmctld.out")
        self.node = self._daemon("slurmd", "-D", "-N", "localhost", "-f", str(self.conf), log="slurmd.out")
        state = [""]

        def idle() -> bool:
            state[0] = self.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
            return state[0] == "idle"

        def a_daemon_exited() -> str | None:
            return exited(self.controller, "slurmctld")() or exited(self.node, "slurmd")()

        wait_for(
            idle,
            timeout,
            "the SLURM node to be idle",
            every=0.5,
            unless=a_daemon_exited,
            detail=lambda: f"the node is {state[0]!r}\n{self.logs()}",
        )
        return self

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}\n{_tail(self.root / name)}"
            for name in ("slurmctld.log", "slurmctld.out", "slurmd.log", "slurmd.out")
        )

    def run(self, *command: str, check: bool = True, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        done = subprocess.run(
            list(command), env=kwargs.pop("env", self.env), capture_output=True, text=True, timeout=timeout, **kwargs
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done

    def sbatch(
        self, script: Path, *args: str, options: tuple[str, ...] = (), cwd: Path, env: dict | None = None
    ) -> str:
        """Submit `script` (with sbatch options before it, arguments after it); return the job id."""
        done = self.run("sbatch", "--parsable", *options, str(script), *args, cwd=cwd, env={**self.env, **(env or {})})
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job`'s fields of a job (ended jobs stay for MinJobAge), {} once it is gone."""
        done = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        fields = {}
        for line in done.stdout.splitlines()[:1]:
            for item in line.split():
                key, _, value = item.partition("=")
                fields[key] = value
        return fields

    def wait_job(self, job_id: str, timeout: float = 300) -> dict[str, str]:
        """Wait until the job has ended; return its fields (JobState, ExitCode, ...)."""
        fields: dict[str, str] = {}

        def ended_fields() -> dict[str, str] | None:
            fields.clear()
            fields.update(self.job(job_id))
            state = fields.get("JobState")
            return dict(fields) if state is not None and state not in JOB_STATES_NOT_ENDED else None

        return wait_for(
            ended_fields,
            timeout,
            f"job {job_id} to end",
            every=0.5,
            detail=lambda: f"it is still {fields.get('JobState')}",
        )

    def stop(self) -> None:
        """Cancel every job, stop both daemons, and kill anything left that this SLURM started."""
        try:
            if self.controller is not None and self.controller.poll() is None:
                self.run("scancel", "--full", "--user=root", check=False)
                holds_within(lambda: not self.run("squeue", "-h", check=False).stdout.strip(), 20, every=0.5)
        finally:
            for daemon in (self.node, self.controller):
                if daemon is not None and daemon.poll() is None:
                    daemon.send_signal(signal.SIGTERM)
            for daemon in (self.node, self.controller):
                if daemon is None:
                    continue
                try:
                    daemon.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(daemon.pid, signal.SIGKILL)
                    daemon.wait(timeout=20)
            entry = f"SLURM_CONF={self.conf}".encode()
            left = _processes_with_environment(entry)
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            holds_within(lambda: not _processes_with_environment(entry), 10, every=0.2)
            still = _processes_with_environment(entry)
            shutil.rmtree(self.root, ignore_errors=True)
        if still:
            raise RuntimeError(f"processes {still} of the test SLURM are still running after SIGKILL")


@contextmanager
def running_slurm() -> Iterator[Slurm]:
    """A started SLURM, with SLURM_CONF pointing this process's clients (and their children) at it; stopped
    and SLURM_CONF restored at the end, whatever happened."""
    cluster = Slurm()
    previous = os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        cluster.stop()


def submit(
    slurm: Slurm,
    tmp_path: Path,
    script: Path,
    tasks: int,
    *overrides: str,
    run_dir: Path | None = None,
    options: tuple[str, ...] = (),
    **env: str,
) -> str:
    """sbatch a shipped script as a user would (sbatch `options` first), with TWO_EPOCHS's tiny data and the
    MLflow store sqlite:///<tmp_path>/mlflow.db as overrides; the run directory is tmp_path/run by default."""
    environment = {key: value for key, value in os.environ.items() if key != "MLFLOW_TRACKING_URI"}
    environment.update(
        RUNNER_PYTHON=sys.executable, RUNNER_RUN_DIR=str(run_dir or tmp_path / "run"), PYTHONUNBUFFERED="1", **env
    )
    # A resumed run must be submitted with the same overrides as the first: the same ports too.
    if not any(item.startswith("cluster.port_base=") for item in overrides):
        overrides = (f"cluster.port_base={free_port_run(tasks)}", *overrides)
    return slurm.sbatch(
        script,
        *TWO_EPOCHS,
        f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        *overrides,
        options=("--cpus-per-task=1", *options),
        cwd=tmp_path,
        env=environment,
    )


def job_output(tmp_path: Path, script: Path, job: str) -> str:
    """The job's .out file in the submit directory (every task's lines, prefixed by the task number)."""
    name = {MULTI_WORKER: "runner-mwms", PARAMETER_SERVER: "runner-ps"}[script]
    path = tmp_path / f"{name}-{job}.out"
    return path.read_text(errors="replace") if path.exists() else f"({path} not written)"


def job_ended(slurm: Slurm, job: str) -> Callable[[], str | None]:
    """For wait_for's `unless`: "job <id> ended (<state>)" once the job is no longer pending or running."""

    def ended() -> str | None:
        state = slurm.job(job).get("JobState")
        return None if state in JOB_STATES_NOT_ENDED else f"job {job} ended ({state})"

    return ended


def wait_for_checkpoint(run_dir: Path, slurm: Slurm, job: str, timeout: float = 240) -> None:
    wait_for(lambda: checkpoints(run_dir), timeout, "a checkpoint", every=0.2, unless=job_ended(slurm, job))


def start_now_once_pending(slurm: Slurm, job: str, *settings: str, timeout: float = 120) -> None:
    """SLURM holds a requeued batch job back (Reason=BeginTime, about two minutes here) before it may start
    again: once it is pending, let it start now, as an administrator would (with any further `scontrol update`
    settings, such as TimeLimit=...)."""
    deadline = time.monotonic() + timeout  # for both waits together
    wait_for(
        lambda: slurm.job(job).get("JobState") == "PENDING",
        timeout,
        f"job {job} to be pending again",
        every=0.2,
        detail=lambda: str(slurm.job(job)),
    )
    # SLURM's own wait lets the job's earlier run finish ending; started at once, it must have ended too.
    entry = f"SLURM_JOB_ID={job}".encode()
    wait_for(
        lambda: not _processes_with_environment(entry),
        deadline - time.monotonic(),
        f"the processes of job {job}'s earlier run to end",
        every=0.2,
        detail=lambda: f"still running: {_processes_with_environment(entry)}",
    )
    # slurmd refuses to launch a job again within the second its credential was revoked in (the requeue's kill):
    # "Killing non-startable batch JobId=...: Job credential revoked", and the job ends FAILED. A sleep on purpose:
    # that second must pass, and slurmd says nowhere when it has.
    time.sleep(2)
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now", *settings)

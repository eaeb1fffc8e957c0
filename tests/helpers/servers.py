"""Real servers on loopback for the team-tracking tests: a throwaway PostgreSQL cluster and an
`mlflow server` on it, each started in a temp directory and stopped with nothing left running."""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from helpers.processes import is_running, stop_group
from helpers.waiting import exited, wait_for

INSTALL_HINT = (
    "install Debian's packages as .ci/run does: apt-get install -y --no-install-recommends postgresql chromium"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(url: str, context: ssl.SSLContext | None = None) -> bool:
    """Whether `url` answers 200 now (a server still starting refuses the connection or resets it)."""
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return response.status == 200
    except OSError:
        return False


def postgres_bin() -> Path:
    """The newest PostgreSQL server binaries Debian installed (they are not on PATH there)."""
    candidates = [Path(path).parent for path in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    candidates.sort(key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0)
    if candidates:
        return candidates[-1]
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise RuntimeError(f"no PostgreSQL server binaries (initdb) found: {INSTALL_HINT}")


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return f"({path} not written)"


class Postgres:
    """A PostgreSQL cluster of its own (initdb into a temp directory, pg_ctl on a free loopback port)
    holding one role and one database for MLflow, reached by password over TCP as a team's would be."""

    def __init__(
        self, log_copy: Path, role: str = "mlflow", password: str = "mlflow-test-password", database: str = "mlflow"
    ):
        self.log_copy = log_copy  # where the server log is kept once the cluster is removed
        self.bin = postgres_bin()
        self.role, self.password, self.database = role, password, database
        self.port = free_port()
        # PostgreSQL refuses to run as root; as root, it runs as the `postgres` user Debian's package
        # created, in a directory that user owns (pytest's tmp_path is private to root).
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.root = Path(tempfile.mkdtemp(prefix="runner-postgres-"))
        if self.as_user:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.postmaster_pid: int | None = None

    @property
    def uri(self) -> str:
        return self.uri_of(self.database)

    def uri_of(self, database: str) -> str:
        # The driver is named: SQLAlchemy 2.1 takes a bare postgresql:// to mean psycopg 3.
        return f"postgresql+psycopg2://{self.role}:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, database: str) -> str:
        """Another database owned by the MLflow role (the auth app's user store); its URI."""
        self.psql(f"CREATE DATABASE {database} OWNER {self.role}")
        return self.uri_of(database)

    def _run(self, *command: str, env: dict | None = None, timeout: float = 60) -> None:
        done = subprocess.run(
            [*self.as_user, *command],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
                f"\nserver log:\n{_tail(self.log)}"
            )

    def start(self) -> Postgres:
        superuser_password = self.root / "superuser-password"
        superuser_password.write_text(self.password + "\n")
        if self.as_user:
            shutil.chown(superuser_password, "postgres")
        # Password (scram) auth over TCP, as the mlflow server will use; --no-sync: a throwaway cluster.
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-E",
            "UTF8",
            f"--pwfile={superuser_password}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--no-sync",
        )
        # Loopback TCP only and no Unix socket: nothing clashes with a system cluster or another test.
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories=''"
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        self.postmaster_pid = int((self.data / "postmaster.pid").read_text().split()[0])
        self.psql(
            f"CREATE ROLE {self.role} LOGIN PASSWORD '{self.password}'",
            f"CREATE DATABASE {self.database} OWNER {self.role}",
        )
        return self

    def psql(self, *statements: str) -> None:
        args = [
            str(self.bin / "psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
            "-q",
        ]
        for statement in statements:
            args += ["-c", statement]
        self._run(*args, env={"PGPASSWORD": self.password})

    def stop(self) -> None:
        """pg_ctl stop (fast: the test is over, open sessions are not waited for); then check that
        the postmaster is gone."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")
        finally:
            survivor = self.postmaster_pid if self.postmaster_pid and is_running(self.postmaster_pid) else None
            if survivor:
                os.kill(survivor, signal.SIGKILL)
            if self.log.exists():
                shutil.copyfile(self.log, self.log_copy)
            shutil.rmtree(self.root, ignore_errors=True)
        if survivor:
            raise RuntimeError(f"PostgreSQL (pid {survivor}) was still running after pg_ctl stop")


@dataclass(frozen=True)
class BasicAuth:
    """MLflow's basic-auth app: its user store and the admin account created at its first start."""

    database_uri: str
    admin_username: str = "admin"
    admin_password: str = "admin-test-password"
    default_permission: str = "READ"

    def ini(self) -> str:
        return (
            f"[mlflow]\ndefault_permission = {self.default_permission}\ndatabase_uri = {self.database_uri}\n"
            f"admin_username = {self.admin_username}\nadmin_password = {self.admin_password}\n"
            # A credential checked once is trusted for a minute (docs/team-server.md): without it, every request
            # of a run pays a scrypt hash of its password.
            f"auth_cache_ttl_seconds = {AUTH_CACHE_SECONDS}\n"
        )


# basic_auth.ini's auth_cache_ttl_seconds, as docs/team-server.md sets it.
AUTH_CACHE_SECONDS = 60


class MlflowServer:
    """`mlflow server` (the one installed beside this Python) with a SQL backend store and artifacts
    proxied to a local directory, on a free loopback port; with `auth`, behind the basic-auth app."""

    def __init__(
        self,
        backend_store_uri: str,
        artifacts: Path,
        log: Path,
        auth: BasicAuth | None = None,
        tls: tuple[Path, Path, Path] | None = None,
    ):
        """`tls`: (certificate, key, CA certificate): serve HTTPS with that certificate, signed by that CA."""
        self.backend_store_uri = backend_store_uri
        self.artifacts = artifacts
        self.log = log
        self.auth = auth
        self.tls = tls
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180) -> MlflowServer:
        mlflow = Path(sys.executable).parent / "mlflow"
        self.artifacts.mkdir(parents=True, exist_ok=True)
        command = [
            str(mlflow),
            "server",
            "--backend-store-uri",
            self.backend_store_uri,
            "--serve-artifacts",
            "--artifacts-destination",
            str(self.artifacts),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
        # A tracking server for training runs needs none of MLflow's job runner and its huey consumers (GenAI
        # judges, trace rollups): about seven processes importing MLflow per server, seconds of CPU and 2 GB.
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        if self.auth is not None:
            ini = self.log.parent / "basic_auth.ini"
            ini.write_text(self.auth.ini())
            ini.chmod(0o600)
            command += ["--app-name", "basic-auth"]
            env["MLFLOW_AUTH_CONFIG_PATH"] = str(ini)
            env["MLFLOW_FLASK_SERVER_SECRET_KEY"] = secrets.token_hex(16)  # signs the UI's CSRF tokens
        context = None
        if self.tls is not None:
            certificate, key, authority = self.tls
            command += ["--uvicorn-opts", f"--ssl-certfile {certificate} --ssl-keyfile {key}"]
            context = ssl.create_default_context(cafile=str(authority))
        with open(self.log, "wb") as log:
            # A session (and so a process group) of its own: the server forks uvicorn and job-runner
            # workers, and stopping it must reach all of them.
            self.process = subprocess.Popen(
                command,
                cwd=self.log.parent,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        # The first start creates MLflow's schema in PostgreSQL.
        wait_for(
            lambda: answers(f"{self.url}/health", context),
            timeout,
            "the mlflow server to answer /health",
            every=0.5,
            unless=exited(self.process, "mlflow server"),
            detail=lambda: _tail(self.log),
        )
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process)

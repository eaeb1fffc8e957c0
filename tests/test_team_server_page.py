"""docs/team-server.md, followed literally: its server blocks run in order in one root shell (as CI runs), then
two people, alice and bob, run its person blocks: alice trains, bob sweeps and registers the best model, alice
registers hers too, and both versions land in the one registered model. The page's shell text runs unchanged
except for SUBSTITUTIONS below (its settings pointed at a temporary directory, a throwaway system user, a
PostgreSQL cluster of the test's own and free loopback ports; apt skipped; tiny training settings appended);
the passwords its `read` prompts ask for are typed on standard input. Every server listens on loopback only; the
one connection that leaves the machine is the page's own `pip install` of the server's environment, which reaches
the package index as .ci/run's install does."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers.data import write_fashion_mnist
from helpers.processes import is_running, live_members, stop_group
from helpers.requires import requires
from helpers.servers import free_port, postgres_bin
from helpers.tracking import as_user, mlflow_client
from helpers.waiting import holds_within

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "team-server.md"
# A fenced block, with the `<!-- test: ... -->` comment on the line before it when it has one.
BLOCK = re.compile(r"(?:<!-- test: (?P<mark>[^>]*?) -->\n)?^```(?P<language>\S*)\n(?P<body>.*?)^```$", re.M | re.S)
SHELL = ("", "bash", "sh")
PERSON_BLOCKS = ("login", "train", "sweep", "register")
NAME = "fashion_mnist"  # the page's experiment and registered model
ADMIN_PASSWORD = "admin-page-password"
PASSWORDS = {"alice": "alice-page-password", "bob": "bob-page-password"}
CAROL_PASSWORD = "carol-page-password"  # the account the page's REST example makes
# Debian root's PATH (`sudo -i`): the server blocks run with the system's python3, not this test's.
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Appended to each `python -m runner` line of the person blocks (later overrides win): one quick epoch; the plain
# training run logs no model (logging one takes tens of seconds here; the sweep and the registering run log theirs).
TINY_RUN = "epochs=1 progress=false strategy=one_device"
NO_MODEL = {"train": " mlflow.log_model=false"}
SERVER_SECONDS = 600  # the server blocks: pip installs MLflow (35 s on an idle machine), the first start (30 s)
PERSON_SECONDS = 420


def shell_blocks(text: str) -> list[tuple[str, str]]:
    """(mark, body) of every shell block of the page, in order; mark is '' when the block has no comment."""
    return [
        ((match["mark"] or "").strip(), match["body"]) for match in BLOCK.finditer(text) if match["language"] in SHELL
    ]


def substitutions(
    home: Path, etc: Path, user: str, cluster: str, pg_port: int, port: int, data: Path
) -> list[tuple[str, str]]:
    """The only changes made to the page's text: (what the page says, what the test runs instead)."""
    return [
        ("MLFLOW_USER=mlflow ", f"MLFLOW_USER={user} "),
        ("MLFLOW_ETC=/etc/mlflow ", f"MLFLOW_ETC={etc} "),
        ("MLFLOW_HOME=/srv/mlflow ", f"MLFLOW_HOME={home} "),
        ("MLFLOW_HOST=0.0.0.0 ", "MLFLOW_HOST=127.0.0.1 "),
        ("MLFLOW_PORT=5000\n", f"MLFLOW_PORT={port}\n"),
        ("PG_CLUSTER=main ", f"PG_CLUSTER={cluster} "),
        ("PGPORT=5432 ", f"PGPORT={pg_port} "),
        # CI installs Debian's packages itself (.ci/run); the test checks they are there instead.
        (
            "apt-get update && apt-get install -y postgresql python3-venv\n",
            "command -v pg_ctlcluster >/dev/null && python3 -c 'import ensurepip'\n",
        ),
        (
            "export MLFLOW_TRACKING_URI=http://mlflow.example.internal:5000\n",
            f"export MLFLOW_TRACKING_URI=http://127.0.0.1:{port}\n",
        ),
        ("DATA=$HOME/data/fashion-mnist ", f"DATA={data} "),
        # One job instead of two: the sweep still registers its best job's model, a training process sooner.
        ("python -m runner -m batch=32,64 ", "python -m runner -m batch=32 "),
    ]


def apply(text: str, table: list[tuple[str, str]]) -> str:
    for old, new in table:
        assert old in text, f"the page no longer says {old!r}: update the test's table"
        text = text.replace(old, new)
    return text


def tiny(body: str, extra: str) -> str:
    return re.sub(r"^(python -m runner .*)$", rf"\1 {TINY_RUN}{extra}", body, flags=re.M)


def test_the_page_parses_into_the_blocks_the_test_runs():
    blocks = shell_blocks(PAGE.read_text())
    marks = [mark for mark, _ in blocks]
    assert all(mark == "" or mark.startswith("skip (") or mark.startswith("person ") for mark in marks), marks
    assert [mark.split()[1] for mark in marks if mark.startswith("person ")] == list(PERSON_BLOCKS)
    assert sum(mark == "" for mark in marks) >= 8
    text = PAGE.read_text()
    apply(text, substitutions(Path("/h"), Path("/e"), "u", "c", 1, 2, Path("/d")))
    text = " ".join(text.split())
    # What a new user tripped over: each is said on the page.
    assert "read -rsp 'Admin password" in text and "ADMIN_PASSWORD" in text
    assert "about 30 seconds" in text and "/health" in text
    assert 'dataset.dir="$DATA"' in text
    assert '"registered_model", NAME, "EDIT"' in text
    assert "Do not put `user:password@` in the address" in text


def _server_processes(uid: int) -> list[int]:
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if int(fields["Uid"].split()[0]) == uid and is_running(int(status.parent.name)):
            pids.append(int(status.parent.name))
    return pids


def _stop_user_processes(uid: int) -> None:
    """Every process group holding a process of the test's own system user (the server, and the root
    `runuser` that started it): SIGTERM, then SIGKILL; raise if any survives."""
    groups = {os.getpgid(pid) for pid in _server_processes(uid) if is_running(pid)}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, sig)
        holds_within(lambda: not (_server_processes(uid) or any(map(live_members, groups))), 30, every=0.2)
    left = _server_processes(uid) + [pid for group in groups for pid in live_members(group)]
    if left:
        raise RuntimeError(f"server processes {left} still run after SIGKILL")


def _bash(script: str, typed: str, cwd: Path, env: dict[str, str], log: Path, timeout: float) -> str:
    """Run a script with bash in a process group of its own, typing `typed` on its standard input; stop
    the group whatever happens; return its output, failing the test with it when the script fails."""
    process = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(typed, timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(process)
        output = process.communicate()[0]
        log.write_text(output)
        raise AssertionError(f"{log.name} timed out after {timeout:.0f} s:\n{output[-4000:]}") from None
    finally:
        if process.poll() is None or live_members(process.pid):
            stop_group(process)
    log.write_text(output)
    assert process.returncode == 0, f"{log.name} failed ({process.returncode}):\n{output[-6000:]}"
    return output


@pytest.mark.slow
@pytest.mark.server
@requires("postgresql", "python3-venv")
@pytest.mark.timeout(1500)
@pytest.mark.skipif(os.geteuid() != 0, reason="the page's server blocks run as root (CI runs as root)")
def test_two_people_train_sweep_and_register_on_a_server_set_up_by_the_page(tmp_path):
    text = PAGE.read_text()
    version = postgres_bin().parent.name
    tag = f"{os.getpid()}"
    user, cluster = f"mlflowpage{tag}", f"runner-page-{tag}"
    pg_port, port = free_port(), free_port()
    # Not pytest's tmp_path (private to root): the server's user and postgres must reach their directories.
    root = Path(tempfile.mkdtemp(prefix="runner-team-page-"))
    root.chmod(0o755)
    home, etc, data = root / "srv" / "mlflow", root / "etc" / "mlflow", root / "data"
    for directory in (home.parent, etc.parent, data):
        directory.mkdir(parents=True)
    write_fashion_mnist(data, train=256, test=128)
    data.chmod(0o755)
    blocks = shell_blocks(apply(text, substitutions(home, etc, user, cluster, pg_port, port, data)))
    server_blocks = [body for mark, body in blocks if mark == ""]
    person = {
        mark.split()[1]: tiny(body, NO_MODEL.get(mark.split()[1], ""))
        for mark, body in blocks
        if mark.startswith("person ")
    }
    # The machine's own clusters are left alone: the page starts and uses this one.
    subprocess.run(
        [
            "pg_createcluster",
            "--start-conf",
            "manual",
            "-p",
            str(pg_port),
            "-d",
            str(root / "pgdata"),
            version,
            cluster,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    admin_env = {
        "PATH": ROOT_PATH,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        **{key: value for key, value in os.environ.items() if key.startswith("PIP_")},
    }
    person_path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    person_env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    person_env.update(PATH=person_path, PYTHONUNBUFFERED="1")
    try:
        # The server: every block in order, in one shell, typing the admin's and then each person's password.
        script = "".join(f"echo '### server block {n}'\n{body}" for n, body in enumerate(server_blocks, 1))
        typed = "".join(f"{password}\n" for password in (ADMIN_PASSWORD, *PASSWORDS.values(), CAROL_PASSWORD))
        _bash(script, typed, ROOT, admin_env, tmp_path / "server-blocks.log", SERVER_SECONDS)
        url = f"http://127.0.0.1:{port}"
        uid = pwd.getpwnam(user).pw_uid
        assert _server_processes(uid), "no process runs as the server's user"
        ini = etc / "basic_auth.ini"
        assert (ini.stat().st_uid, ini.stat().st_mode & 0o777) == (uid, 0o600)
        installed = subprocess.run(
            [str(home / "venv" / "bin" / "pip"), "list", "--format=freeze"], capture_output=True, text=True, check=True
        ).stdout.lower()
        assert "mlflow==" in installed and "psycopg2-binary==" in installed and "flask-wtf==" in installed
        assert "tensorflow" not in installed and "tf-keras" not in installed, installed

        from mlflow.server import get_app_client

        with as_user("admin", ADMIN_PASSWORD):
            client = mlflow_client(url)
            experiment_id = client.get_experiment_by_name(NAME).experiment_id
            users = get_app_client("basic-auth", tracking_uri=url)
            for name in (*PASSWORDS, "carol"):
                for resource in (("experiment", experiment_id), ("registered_model", NAME)):
                    assert users.get_user_permission(name, *resource).permission == "EDIT", (name, resource)

        def runs() -> dict[str, object]:
            with as_user("admin", ADMIN_PASSWORD):
                return {run.info.run_id: run for run in client.search_runs([experiment_id])}

        def versions() -> dict[str, str]:
            with as_user("admin", ADMIN_PASSWORD):
                return {v.version: v.run_id for v in client.search_model_versions(f"name = '{NAME}'")}

        def as_person(name: str, *steps: str) -> set[str]:
            """The person's login block and then `steps`, in their own shell and directory; the new run ids."""
            before = set(runs())
            workdir = tmp_path / name
            workdir.mkdir(exist_ok=True)
            script = "".join(person[step] for step in ("login", *steps))
            log = tmp_path / f"{name}-{'-'.join(steps)}.log"
            output = _bash(script, f"{name}\n{PASSWORDS[name]}\n", workdir, person_env, log, PERSON_SECONDS)
            assert not any(password in output for password in (ADMIN_PASSWORD, *PASSWORDS.values()))
            return set(runs()) - before

        assert versions() == {}  # the admin made the model; nobody registered yet
        alice_runs = as_person("alice", "train")
        assert len(alice_runs) == 1
        bob_runs = as_person("bob", "sweep")
        assert len(bob_runs) == 2  # the sweep's parent run and its job
        first = versions()
        assert list(first) == ["1"] and first["1"] in bob_runs
        alice_registered = as_person("alice", "register")
        assert len(alice_registered) == 1
        both = versions()
        # alice's registration into the model bob's sweep registered first: no 403 any more.
        assert sorted(both) == ["1", "2"] and both["2"] in alice_registered
        every_run = runs()
        assert all(every_run[run].info.status == "FINISHED" for run in alice_runs | bob_runs | alice_registered)
    finally:
        try:
            with contextlib.suppress(KeyError):
                _stop_user_processes(pwd.getpwnam(user).pw_uid)
        finally:
            log = home / "log" / "server.log"
            if log.exists():
                shutil.copyfile(log, tmp_path / "mlflow-server.log")
            subprocess.run(["pg_dropcluster", "--stop", version, cluster], capture_output=True, timeout=120)
            with contextlib.suppress(KeyError):
                pwd.getpwnam(user)
                subprocess.run(["userdel", user], check=True, capture_output=True, timeout=60)
            shutil.rmtree(root, ignore_errors=True)

"""A tracking server behind HTTPS with a private certificate authority, made in the test: the pre-check trusts what
MLflow's own client trusts (MLFLOW_TRACKING_SERVER_CERT_PATH, MLFLOW_TRACKING_INSECURE_TLS) instead of calling the
server down, and says which variable to set when it cannot verify the certificate."""

from __future__ import annotations

import subprocess

import pytest

from helpers.cli import run_cli
from helpers.config import mlflow_settings
from helpers.presets import TINY
from helpers.servers import MlflowServer
from helpers.tracking import mlflow_client

pytestmark = pytest.mark.server


def _authority_and_certificate(directory) -> tuple:
    """A CA, and a certificate for 127.0.0.1 signed by it (openssl, as an admin would make them)."""
    ca_key, ca, key, request, certificate = (
        directory / name for name in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem")
    )
    extensions = directory / "server.ext"
    extensions.write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-days",
        "2",
        "-subj",
        "/CN=runner test CA",
    )
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(request), "-subj", "/CN=127.0.0.1")
    openssl(
        "x509",
        "-req",
        "-in",
        str(request),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        str(certificate),
        "-days",
        "2",
        "-extfile",
        str(extensions),
    )
    return certificate, key, ca


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    certificate, key, ca = _authority_and_certificate(directory)
    server = MlflowServer(
        f"sqlite:///{directory / 'server.db'}",
        artifacts=directory / "artifacts",
        log=directory / "mlflow-server.log",
        tls=(certificate, key, ca),
    )
    try:
        yield server.start(), ca
    finally:
        server.stop()


@pytest.mark.slow
def test_a_server_signed_by_a_private_ca_that_mlflow_trusts_is_not_called_down(tls_server, tmp_path, monkeypatch):
    server, ca = tls_server
    done = run_cli(
        *TINY,
        "strategy=one_device",
        f"mlflow.tracking_uri={server.url}",
        cwd=tmp_path,
        env={"MLFLOW_TRACKING_SERVER_CERT_PATH": str(ca)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    monkeypatch.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", str(ca))
    client = mlflow_client(server.url)
    [run] = client.search_runs([client.get_experiment_by_name("fashion_mnist").experiment_id])
    assert run.info.status == "FINISHED"


@pytest.mark.slow
def test_an_untrusted_certificate_names_the_variables_and_tracks_nothing(tls_server, tmp_path):
    server, _ = tls_server
    done = run_cli(*TINY, "strategy=one_device", f"mlflow.tracking_uri={server.url}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert "its TLS certificate was not accepted" in error and "MLFLOW_TRACKING_SERVER_CERT_PATH" in error
    assert "does not answer" not in error


def test_insecure_tls_skips_verification_as_mlflow_does(tls_server, monkeypatch):
    from runner.errors import RunnerError
    from runner.tracking.server_access import check_server

    server, _ = tls_server
    settings = mlflow_settings(server.url)
    with pytest.raises(RunnerError, match="not accepted"):
        check_server(settings)
    monkeypatch.setenv("MLFLOW_TRACKING_INSECURE_TLS", "true")
    check_server(settings)  # raises a RunnerError if the certificate is refused

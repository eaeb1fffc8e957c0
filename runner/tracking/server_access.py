"""Before anything trains: does the tracking server answer, does it accept this user's credentials, and may
this user create runs in the experiment. Plain urllib (no MLflow), so a refusal costs a fraction of a second,
comes before TensorFlow loads, and leaves no run behind.

Credentials come from MLflow's own environment variables, MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD
(or MLFLOW_TRACKING_TOKEN), which MLflow's client sends as well; a tracking URI that embeds them is refused, since
the URI is recorded with the run. No message here ever contains a password.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request

from runner.config.checks import refuse_credentials_in_uri
from runner.config.schema import MlflowSettings
from runner.errors import RunnerError

USERNAME_VARIABLE = "MLFLOW_TRACKING_USERNAME"
PASSWORD_VARIABLE = "MLFLOW_TRACKING_PASSWORD"
TOKEN_VARIABLE = "MLFLOW_TRACKING_TOKEN"
# MLflow's own TLS settings, which its client (requests) honours: the pre-check trusts what MLflow would trust.
INSECURE_TLS_VARIABLE = "MLFLOW_TRACKING_INSECURE_TLS"
SERVER_CERT_VARIABLE = "MLFLOW_TRACKING_SERVER_CERT_PATH"
CLIENT_CERT_VARIABLE = "MLFLOW_TRACKING_CLIENT_CERT_PATH"
# MLflow basic-auth's permissions that may create runs in an experiment, or versions of a registered model
# (READ and USE may not).
_CAN_WRITE = ("EDIT", "MANAGE")


def tracking_server(settings: MlflowSettings) -> str | None:
    """The HTTP tracking server runs go to (mlflow.tracking_uri, else $MLFLOW_TRACKING_URI), or None for a
    local store (MLflow's default is a sqlite file, never a server)."""
    uri = settings.tracking_uri
    if uri is None:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or None
        if uri is not None:
            refuse_credentials_in_uri("MLFLOW_TRACKING_URI", uri)
    return uri.rstrip("/") if uri and uri.startswith(("http://", "https://")) else None


def check_server(settings: MlflowSettings, timeout: float = 10.0, registers: bool = False) -> None:
    """Fail fast, in one paragraph, when the server does not answer (MLflow itself retries for minutes), refuses
    the credentials (401), or would refuse to create this user's run in the experiment (403), or, for a job that
    will register its model (`registers`: a sweep, or mlflow.register=true), a version of the registered model."""
    server = tracking_server(settings)
    if server is None:
        return
    health = server + "/health"  # not behind the login
    context = tls_context(server)
    try:
        with urllib.request.urlopen(health, timeout=timeout, context=context) as response:
            response.read()
    except (OSError, urllib.error.URLError) as error:
        reason = getattr(error, "reason", error)
        if isinstance(reason, ssl.SSLError):
            raise RunnerError(
                f"mlflow.tracking_uri={server!r} answered, but its TLS certificate was not accepted ({reason}). Fix: "
                f"set {SERVER_CERT_VARIABLE} to the certificate (PEM) of the authority that signed it, as MLflow's "
                f"client reads it (or {INSECURE_TLS_VARIABLE}=true to skip verification on a network you trust), "
                "then re-run; nothing was tracked."
            ) from None
        raise RunnerError(
            f"mlflow.tracking_uri={server!r} does not answer ({health}: {getattr(error, 'reason', error)}). "
            "Fix: start the tracking server (see docs/team-server.md) or point mlflow.tracking_uri at a running "
            "one; leave it unset to track into sqlite:///mlflow.db in the working directory."
        ) from None
    access = _Access(server, timeout, context)
    name = settings.experiment_name
    status, body = access.get("/api/2.0/mlflow/experiments/get-by-name", experiment_name=name)
    if status == 401:
        raise access.unauthenticated()
    if status == 403:
        raise access.forbidden(f"it may not even read experiment {name!r}")
    if status == 200 and access.username is not None:  # no such experiment yet: the run creates it and manages it
        experiment_id = body["experiment"]["experiment_id"]
        permission = access.permission("experiment", experiment_id)
        if permission is not None and permission not in _CAN_WRITE and not access.is_admin():
            raise access.forbidden(
                f"it has {permission} permission on experiment {name!r} (id {experiment_id}), and creating a run "
                f"there takes {' or '.join(_CAN_WRITE)}"
            )
    if registers and access.username is not None:
        _check_registration(access, settings.registered_model_name)


def _check_registration(access: _Access, model: str) -> None:
    """The registered model's permissions stop at the model: its creator manages it, and another user who may edit
    the experiment still gets 403 when the run registers, after it trained. Refused here instead."""
    status, _ = access.get("/api/2.0/mlflow/registered-models/get", name=model)
    if status != 200:  # no such model yet: this run creates it, and its user then manages it
        return
    permission = access.permission("registered_model", model)
    if permission is None or permission in _CAN_WRITE or access.is_admin():
        return
    who = repr(access.username)
    raise RunnerError(
        f"the tracking server {access.server} would refuse to register this run's model for user {who} (403 "
        f"Forbidden): it has {permission} permission on the registered model {model!r}, which another user "
        f"created, and adding a version takes {' or '.join(_CAN_WRITE)}. Fix: ask an admin of the server (or the "
        f"model's creator) to grant {who} EDIT on the registered model {model!r} (docs/team-server.md), or pass "
        "mlflow.registered_model_name=<a model you may edit>, or mlflow.register=false for a single run; nothing "
        "was tracked."
    )


def tls_context(server: str, environ=os.environ) -> ssl.SSLContext | None:
    """The TLS settings MLflow's client would use for `server`: its CA bundle (or none, with insecure TLS) and the
    client certificate; None for plain HTTP."""
    if not server.startswith("https://"):
        return None
    if environ.get(INSECURE_TLS_VARIABLE, "").lower() in ("true", "1"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        cafile = environ.get(SERVER_CERT_VARIABLE) or environ.get("REQUESTS_CA_BUNDLE") or None
        context = ssl.create_default_context(cafile=cafile)
    client_cert = environ.get(CLIENT_CERT_VARIABLE)
    if client_cert:
        context.load_cert_chain(client_cert)  # a PEM holding the certificate and its key, as requests takes it
    return context


class _Access:
    """GET requests to the server as the user the environment names."""

    def __init__(self, server: str, timeout: float, context: ssl.SSLContext | None = None):
        self.server, self.timeout, self.context = server, timeout, context
        self.username = os.environ.get(USERNAME_VARIABLE) or None
        password = os.environ.get(PASSWORD_VARIABLE) or None
        token = os.environ.get(TOKEN_VARIABLE) or None
        self._missing = None
        if self.username and password:
            self._authorization: str | None = (
                "Basic " + base64.b64encode(f"{self.username}:{password}".encode()).decode()
            )
        elif token:
            self._authorization = f"Bearer {token}"
        else:
            self._authorization = None
            if self.username or password:
                self._missing = PASSWORD_VARIABLE if self.username else USERNAME_VARIABLE

    def get(self, path: str, **query: str) -> tuple[int, dict]:
        url = self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")
        request = urllib.request.Request(url)
        if self._authorization:
            request.add_header("Authorization", self._authorization)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as response:
                return response.status, _json(response.read())
        except urllib.error.HTTPError as error:
            return error.code, _json(error.read())
        except (OSError, urllib.error.URLError) as error:
            raise RunnerError(
                f"mlflow.tracking_uri={self.server!r} stopped answering ({path}: {getattr(error, 'reason', error)})."
                " Fix: check that the tracking server is up (docs/team-server.md), then re-run."
            ) from None

    def permission(self, resource_type: str, resource_id: str) -> str | None:
        """This user's permission on a resource, or None where the server cannot say (no basic-auth: 404)."""
        status, body = self.get(
            "/api/3.0/mlflow/users/permissions/get",
            username=self.username or "",
            resource_type=resource_type,
            resource_id=resource_id,
        )
        return body.get("permission") if status == 200 else None

    def is_admin(self) -> bool:
        status, current = self.get("/api/2.0/mlflow/users/current")
        return status == 200 and bool(current.get("user", {}).get("is_admin"))

    def unauthenticated(self) -> RunnerError:
        how = (
            f"{USERNAME_VARIABLE} and {PASSWORD_VARIABLE} to your account's name and password (the server's "
            "admin creates one per person: docs/team-server.md)"
        )
        if self._authorization is None:
            missing = f"{self._missing} is not set" if self._missing else "no credentials are set"
            return RunnerError(
                f"the tracking server {self.server} requires a login (401 Unauthorized) and {missing}. "
                f"Fix: export {how}, then re-run; nothing was tracked."
            )
        who = f"user {self.username!r}" if self.username else f"the token in {TOKEN_VARIABLE}"
        return RunnerError(
            f"the tracking server {self.server} rejected the credentials of {who} (401 Unauthorized): the password "
            f"is wrong or there is no such account. Fix: set {how}; an admin can reset a forgotten password. "
            "Nothing was tracked."
        )

    def forbidden(self, why: str) -> RunnerError:
        who = repr(self.username) if self.username else "this account"
        return RunnerError(
            f"the tracking server {self.server} would refuse to create the run for user {who} (403 Forbidden): "
            f"{why}. Fix: ask an admin of the server to grant {who} EDIT on the experiment (docs/team-server.md), "
            "or pass mlflow.experiment_name=<an experiment you may edit>; nothing was tracked."
        )


def _json(raw: bytes) -> dict:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:  # basic-auth's 401 and 403 bodies are plain text
        return {}
    return value if isinstance(value, dict) else {}

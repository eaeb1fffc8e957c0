"""hydra/launcher=ray's settings, checked before a sweep's parent run exists (runner.sweeps.launch.launchers runs the
checks): the cluster address forms ray.init takes, what Ray refuses when joining a cluster, that the cluster's
head answers, and the Ray token the sweep joins with."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.config.checks import Number, refusal
from runner.errors import RunnerError

# How long a cluster's head may take to accept a connection before the sweep gives up on it.
CONNECT_TIMEOUT_SECONDS = 5.0
# The address forms ray.init takes besides HOST:PORT, and what it refuses when joining a cluster.
RAY_ADDRESS_WORDS = ("local", "auto")
RAY_SIZES_OF_A_NEW_CLUSTER = ("num_cpus", "num_gpus", "object_store_memory", "resources")
RAY_TASK_AMOUNTS = ("num_cpus", "num_gpus", "memory")


@dataclass(frozen=True)
class RayLauncherSettings:
    address_key: str  # where the address came from: the config key or RAY_ADDRESS
    address: str | None  # as given: HOST:PORT, ray://HOST:PORT, local, auto or None
    head: tuple[str, int] | None  # the host and port to reach, or None when Ray starts or finds its own


def _ray_head(key: str, address: str) -> tuple[str, int]:
    fix = (
        "pass the address `ray start --head` printed, e.g. hydra.launcher.ray.init.address=10.0.0.5:6379, "
        "or leave it null to start a Ray on this machine for the sweep"
    )
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise refusal(key, address, "it must be HOST:PORT (or ray://HOST:PORT for Ray Client), local or auto", fix)
    return host, int(port)


def ray_launcher(node: Any, environ: Mapping[str, str] = os.environ) -> RayLauncherSettings:
    """Validate hydra.launcher.ray (init and remote) for a sweep on Ray."""
    init = (node or {}).get("init") or {}
    remote = (node or {}).get("remote") or {}
    key = "hydra.launcher.ray.init.address"
    address = init.get("address")
    if address is not None and (not isinstance(address, str) or not address.strip()):
        raise refusal(
            key,
            address,
            "it must be HOST:PORT, local, auto or null",
            "pass the address `ray start --head` printed, or null to start a Ray on this machine",
        )
    if address in (None, "auto") and environ.get("RAY_ADDRESS"):
        # ray.init reads it when the config names no cluster.
        key, address = "RAY_ADDRESS", environ["RAY_ADDRESS"]
    head = None if address is None or address in RAY_ADDRESS_WORDS else _ray_head(key, address)
    if address not in (None, "local"):
        for name in RAY_SIZES_OF_A_NEW_CLUSTER:
            if init.get(name) is not None:
                raise refusal(
                    f"hydra.launcher.ray.init.{name}",
                    init[name],
                    f"Ray refuses it when joining an existing cluster ({key}={address})",
                    f"give the cluster its size where it starts (ray start --{name.replace('_', '-')}=...) and each "
                    f"job its share with hydra.launcher.ray.remote.num_cpus=N (or num_gpus, memory); "
                    f"pass hydra.launcher.ray.init.{name}=null",
                )
    for name in RAY_TASK_AMOUNTS:
        if name in remote and remote[name] is not None:
            Number(minimum=0.0)(
                f"hydra.launcher.ray.remote.{name}",
                remote[name],
                f"pass what one job needs, e.g. hydra.launcher.ray.remote.{name}=1",
            )
    return RayLauncherSettings(key, address, head)


def check_ray_address(ray_config: Any, environ: Mapping[str, str] = os.environ) -> None:
    """A concrete cluster address (in the config or RAY_ADDRESS) must accept a connection: ray.init would
    otherwise retry it for minutes before failing."""
    settings = ray_launcher(ray_config, environ)
    if settings.head is None:
        return
    host, port = settings.head
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_SECONDS):
            pass
    except OSError as error:
        why = "timed out" if isinstance(error, socket.timeout) else (error.strerror or type(error).__name__)
        where = "the head machine" if host not in ("127.0.0.1", "localhost") else "this machine"
        raise RunnerError(
            f"{settings.address_key}={settings.address} does not answer ({why} at {host}:{port}), so the sweep "
            f"cannot reach a Ray cluster there and nothing was started. Fix: start the cluster first (`ray start "
            f"--head --port={port}` on {where}, then `ray start --address=<head>:{port}` on each other machine) "
            "and pass the address its head prints, or leave hydra.launcher.ray.init.address out (and RAY_ADDRESS "
            "unset) to run the sweep on a Ray started for it on this machine."
        ) from None


def join_with_the_local_ray_token(environ: MutableMapping[str, str] = os.environ) -> None:
    """Use the Ray token this machine holds, as `ray start` does. Ray (2.60) turns token authentication on for a
    cluster whose `ray start --head` finds a token (~/.ray/auth_token, which every Ray that ray.init starts
    writes), but ray.init only sends one in token mode, so the sweep would fail to join with "Authentication
    token is missing or incorrect". A cluster without authentication accepts a token too."""
    if "RAY_AUTH_MODE" in environ:  # the user's choice
        return
    path = environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    if environ.get("RAY_AUTH_TOKEN") or os.path.isfile(path):
        environ["RAY_AUTH_MODE"] = "token"

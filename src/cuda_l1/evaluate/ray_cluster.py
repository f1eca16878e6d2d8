"""Reaching the Ray cluster a RayPool runs on: which cluster to join (or start), and what the Ray job
hands every actor from the driver's side.

Kept apart from ray_pool.py, which manages the actors and their jobs, so that deciding where the
cluster is (an explicit address, RAY_ADDRESS, what `ray start` recorded on this host, else a private
instance) and checking the job's runtime_env for credentials sit in one place. Like ray_pool.py it
needs Ray, and only ray_pool.py imports it, so `cuda_l1.evaluate.pool` still imports without Ray.
"""

from __future__ import annotations

import os
import socket

import ray

from cuda_l1.errors import UserError


def recorded_address(timeout_s: float = 2.0) -> str | None:
    """The address a `ray start` on this host recorded, if something still listens there.

    Ray itself would wait minutes on the address of a cluster that was stopped uncleanly.
    """
    try:
        from ray._private.utils import read_ray_address  # not public API: any failure means "none"

        recorded = read_ray_address()
        host, _, port = (recorded or "").rpartition(":")
        if not host or not port.isdigit():
            return None
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return recorded
    except Exception:
        return None


def connect(device: str, workers: int | None, address: str | None, cpus_per_worker: float) -> None:
    """Join `address`, else the cluster that RAY_ADDRESS or `ray start` point at, else start a local one.

    Whatever it joined or started, the caller owns the connection (it shuts Ray down at the end)."""
    try:
        if address or os.environ.get("RAY_ADDRESS"):
            ray.init(address=address)
        elif (recorded := recorded_address()) is not None:
            ray.init(address=recorded)
        else:
            # A private instance on this host, big enough for the CPU workers asked for. "local" keeps
            # Ray from looking for a cluster again (and from hanging on a stale one).
            wanted = cpus_per_worker * max(1, workers or 1) if not device.startswith("cuda") else 0
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, int(wanted + 0.999)),
                     include_dashboard=False)
    except ConnectionError as exc:
        raise UserError(f"could not reach the Ray cluster at {address or os.environ.get('RAY_ADDRESS')}: "
                        f"{exc}") from None


def runtime_env_secrets() -> list[str]:
    """Credential-like variable names in the runtime_env of the connected Ray job.

    Actors inherit the job's runtime_env (Ray merges its env_vars into every actor's), so a key put
    there would sit in every evaluation worker. Candidates would still not see it (their children get
    an allow-listed environment), but a worker needs no credentials, so the pool warns.
    """
    from cuda_l1.evaluate.environment import SECRET_NAME

    try:
        env_vars = (ray.get_runtime_context().runtime_env or {}).get("env_vars") or {}
    except Exception:  # an older or client-mode context without runtime_env
        return []
    return sorted(k for k in env_vars if SECRET_NAME.search(k))

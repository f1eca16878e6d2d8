"""Evaluation pools: one interface for `bench`, `audit`, `optimize` and training.

    with make_pool("local", device="cuda") as pool:          # one worker per visible GPU
        for result in pool.run(jobs):                         # as they complete
            store.record_verdict(...)                         # the caller is the one store owner

This module only chooses the backend: `LocalPool` (local_pool.py, worker processes on this host) or
`RayPool` (ray_pool.py, the same workers as actors across the hosts of a Ray cluster). Both keep the
contract of jobs.py. Ray is optional, so it is imported only when a Ray pool is asked for. The names
callers use with a pool (jobs, results, the local backend and its worker placement) are re-exported
here; modules of `cuda_l1.evaluate` import the backend or the contract directly, never this factory.
"""

from __future__ import annotations

from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.jobs import EvalJob, EvalPool, EvalResult, failed_verdict
from cuda_l1.evaluate.local_pool import LocalPool, visible_gpus, worker_devices

__all__ = ["EvalJob", "EvalPool", "EvalResult", "LocalPool", "failed_verdict", "make_pool", "visible_gpus",
           "worker_devices"]


def make_pool(cluster: str = "local", device: str = "cuda", config: EvalConfig | None = None,
              workers: int | None = None) -> EvalPool:
    """`local`, `ray` (an existing or new local Ray cluster) or `ray://ADDRESS`."""
    from cuda_l1.devices import check_cluster
    from cuda_l1.errors import UserError

    check_cluster(cluster)
    if cluster == "local":
        return LocalPool(device, config, workers)
    try:
        from cuda_l1.evaluate.ray_pool import RayPool
    except ImportError as exc:
        raise UserError(f"--cluster {cluster} needs Ray: pip install 'cuda-l1[ray]' ({exc}).") from None
    return RayPool(device, config, workers, address=None if cluster == "ray" else cluster)

"""``bench create --warm-pool N``: create → ready (the create's answer) and create →
first command from a warm pool, beside an ordinary create → first command timed in the
same run, and what a pooled sandbox costs.

A server of the bench's own runs with ``--warm-pool IMAGE=N``; before each timed create
the bench waits until the pool is full again and the last sandbox's removal is over, so
every sample is a claim on an otherwise idle server (as the ordinary creates beside it
are), not a claim racing the pool's refill for the two cores. The memory a pooled sandbox costs is
the server tree's PSS with the pool full, less that of a server without a pool, over N.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import psutil
from rich.progress import track

from orchard_env_client import SandboxClient

from .common import OwnServer, percentiles
from .concurrency import tree_pss_bytes

POOL_TARGET_P50_MS = 15.0


def server_pss_bytes(pid: int) -> int | None:
    """The summed PSS of a server process and all its descendants."""
    return tree_pss_bytes([psutil.Process(pid)])


def _settled(url: str, image: str, size: int) -> bool:
    """The pool is full and no removal is under way."""
    body = httpx.get(f"{url}/resources", timeout=10).json()
    ready = int(body.get("warm_pools", {}).get(image, {}).get("ready", 0))
    return ready >= size and not body.get("sandboxes_reaping")


def _wait_for(url: str, image: str, size: int, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not _settled(url, image, size):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm pool did not fill to {size} in {seconds:g} s")
        time.sleep(0.02)


def bench_pool(image: str, size: int, runs: int, idle_pss: int | None) -> dict[str, Any]:
    """Claims from a pool of ``size``; ``idle_pss``: the tree PSS of a pool-less server."""
    own = OwnServer("local", ["--warm-pool", f"{image}={size}"])
    try:
        _wait_for(own.url, image, size)
        full_pss = server_pss_bytes(own.pid)
        ready: list[float] = []
        first: list[float] = []
        with SandboxClient(base_url=own.url) as client:
            for _ in track(range(runs), description="create from a warm pool", transient=True):
                _wait_for(own.url, image, size)
                started = time.perf_counter()
                sandbox = client.create_sandbox(image)  # answered ``ready``
                ready.append(time.perf_counter() - started)
                sandbox.exec("true")
                first.append(time.perf_counter() - started)
                sandbox.delete()
    finally:
        own.close()
    per_sandbox = (
        (full_pss - idle_pss) // size if idle_pss is not None and full_pss is not None else None
    )
    return {
        "size": size,
        "ready": percentiles(ready),
        "orchard": percentiles(first),
        "pss_per_pooled_sandbox_bytes": per_sandbox,
    }

"""``bench create``: create → ready, one sandbox at a time, next to a bare ``docker run``."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import track

from orchard_env_client import SandboxClient

from .common import (
    OwnServer,
    default_image,
    latency_table,
    machine_facts,
    percentiles,
    plot_percentile_bars,
    time_calls,
)


def bench_create(
    url: str | None, backend: str, runs: int, image: str | None = None
) -> dict[str, Any]:
    """Orchard's create → first command, and ``docker run --rm`` of the same image: always
    on Docker and Kubernetes, and on the local backend for an image of its image store
    (a reference such as ``python:3.11-slim``, which the Docker engine must hold too)."""
    image = default_image(backend, image)
    own = None if url else OwnServer(backend)
    base = url or own.url  # type: ignore[union-attr]
    results: dict[str, Any] = {
        "bench": "create",
        "backend": backend,
        "runs": runs,
        "image": image,
        "machine": machine_facts(),
    }
    samples = []
    try:
        with SandboxClient(base_url=base) as client:
            client.create_sandbox(image).delete()  # warm up
            for _ in track(range(runs), description="orchard create → ready", transient=True):
                started = time.perf_counter()
                sandbox = client.create_sandbox(image)
                sandbox.exec("true")  # ready means it runs commands: prove it
                samples.append(time.perf_counter() - started)
                sandbox.delete()
    finally:
        if own:
            own.close()
    results["orchard"] = percentiles(samples)
    if backend in ("docker", "kubernetes") or _stored_image(image):
        results["baseline"] = time_calls(
            "docker run --rm",
            runs,
            lambda: subprocess.run(
                ["docker", "run", "--rm", "--network", "none", image, "true"],
                check=True,
                capture_output=True,
            ),
        )
        results["baseline_name"] = "docker run --rm <image> true"
        results["ratio_p50"] = results["orchard"]["p50_ms"] / results["baseline"]["p50_ms"]
    return results


def _stored_image(image: str) -> bool:
    """A local-backend image that is a registry reference, not ``host`` or a directory."""
    return image != "host" and not image.startswith("/")


def print_create(results: dict[str, Any], out: Console | None = None) -> None:
    """The rich table of a ``bench_create`` result."""
    out = out or Console()
    rows = [("orchard create → first command", results["orchard"])]
    if "baseline" in results:
        rows.append((results["baseline_name"], results["baseline"]))
    title = f"create → ready on {results['backend']} ({results['image']}), {results['runs']} runs"
    out.print(latency_table(title, rows, 1))
    if "ratio_p50" in results:
        out.print(f"ratio p50 orchard / baseline: {results['ratio_p50']:.2f}")


def plot_create(results: dict[str, Any], path: Path) -> None:
    """p50/p99 bars of create → ready next to the baseline, saved as PNG."""
    present = [("orchard", "orchard")] + (
        [("baseline", "docker run --rm")] if "baseline" in results else []
    )
    plot_percentile_bars(results, present, path, title=f"create → ready on {results['backend']}")

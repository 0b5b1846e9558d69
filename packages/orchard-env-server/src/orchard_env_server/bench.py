"""``orchard-env bench latency|create``: the service's speed next to direct baselines.

Every number comes from one run on this machine: the full path (client → orchestrator →
agent → process), the agent called directly (no orchestrator), and the baseline: a bare
process spawn of the same command locally, ``docker exec`` / ``docker run`` on Docker.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import track
from rich.table import Table

from orchard_env_client import SandboxClient


def percentiles(samples_s: list[float]) -> dict[str, float]:
    """p50/p90/p99 and mean, in milliseconds."""
    ordered = sorted(samples_s)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {
        "p50_ms": pick(0.50),
        "p90_ms": pick(0.90),
        "p99_ms": pick(0.99),
        "mean_ms": statistics.fmean(ordered) * 1000,
    }


def _time(label: str, runs: int, call: Callable[[], Any]) -> dict[str, float]:
    call()  # warm up connections and caches
    samples = []
    for _ in track(range(runs), description=label, transient=True):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return percentiles(samples)


class _OwnServer:
    """A throwaway orchestrator on a free port, for benches not given ``--url``."""

    def __init__(self, backend: str) -> None:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self._state = tempfile.TemporaryDirectory(prefix="orchard-bench-")
        self.state_dir = Path(self._state.name) / "s"
        argv = [sys.executable, "-m", "orchard_env_server.cli", "serve", "--backend", backend,
                "--port", str(self.port), "--state-dir", str(self.state_dir)]  # fmt: skip
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("bench server did not start")

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=30)
        self._state.cleanup()


DEFAULT_IMAGES = {"local": "host", "docker": "orchard-test/debian"}


def bench_latency(
    url: str | None, backend: str, runs: int, command: str, image: str | None = None
) -> dict[str, Any]:
    own = None if url else _OwnServer(backend)
    base = url or own.url  # type: ignore[union-attr]
    try:
        with SandboxClient(base_url=base) as client:
            sandbox = client.create_sandbox(image or DEFAULT_IMAGES[backend])
            orchard = _time("orchard exec", runs, lambda: sandbox.exec(command))
            results: dict[str, Any] = {"backend": backend, "runs": runs, "command": command,
                                       "orchard": orchard}  # fmt: skip
            agent = _direct_agent(own.state_dir, sandbox.sandbox_id) if own else None
            if agent is not None:
                url_, headers, uds = agent
                transport = httpx.HTTPTransport(uds=uds) if uds else None
                with httpx.Client(transport=transport) as http:
                    body = {"command": command, "wait": True}
                    results["agent_direct"] = _time(
                        "agent direct",
                        runs,
                        lambda: http.post(url_ + "/exec", json=body, headers=headers),
                    )
            if backend == "docker":
                argv = ["docker", "exec", f"orchard-{sandbox.sandbox_id}", "sh", "-c", command]
                results["baseline_name"] = "docker exec <container> sh -c command"
            else:
                argv = ["bash", "-c", command]
                results["baseline_name"] = "subprocess.run(['bash', '-c', command])"
            results["baseline"] = _time(
                "baseline", runs, lambda: subprocess.run(argv, check=False, capture_output=True)
            )
            sandbox.delete()
    finally:
        if own:
            own.close()
    results["ratio_p50"] = results["orchard"]["p50_ms"] / results["baseline"]["p50_ms"]
    if "agent_direct" in results:
        results["orchestrator_overhead_p50_ms"] = (
            results["orchard"]["p50_ms"] - results["agent_direct"]["p50_ms"]
        )
    return results


def bench_create(
    url: str | None, backend: str, runs: int, image: str | None = None
) -> dict[str, Any]:
    """Create → ready of one sandbox at a time, next to a bare ``docker run`` (Docker)."""
    image = image or DEFAULT_IMAGES[backend]
    own = None if url else _OwnServer(backend)
    base = url or own.url  # type: ignore[union-attr]
    results: dict[str, Any] = {"backend": backend, "runs": runs, "image": image}
    try:
        with SandboxClient(base_url=base) as client:
            client.create_sandbox(image).delete()  # warm up
            samples = []
            for _ in track(range(runs), description="orchard create → ready", transient=True):
                started = time.perf_counter()
                sandbox = client.create_sandbox(image)
                sandbox.exec("true")  # ready means it runs commands: prove it
                samples.append(time.perf_counter() - started)
                sandbox.delete()
            results["orchard"] = percentiles(samples)
    finally:
        if own:
            own.close()
    if backend == "docker":
        results["baseline"] = _time(
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


def _direct_agent(
    state_dir: Path, sandbox_id: str
) -> tuple[str, dict[str, str], str | None] | None:
    """The agent's address, this sandbox's token and socket, read from the bench's own state."""
    for record in (
        state_dir / "sandboxes" / sandbox_id / "record.json",
        state_dir / "docker" / sandbox_id / "record.json",
    ):
        if record.exists():
            agent = json.loads(record.read_text()).get("agent")
            if agent:
                headers = {"Authorization": f"Bearer {agent['token']}"}
                if agent.get("sandbox_header"):
                    headers["X-Orchard-Sandbox"] = agent["sandbox_header"]
                return agent["base_url"], headers, agent.get("uds")
    return None


def _table(title: str, rows: list[tuple[str, dict[str, float]]], digits: int) -> Table:
    table = Table(title=title)
    for col in ("path", "p50 ms", "p90 ms", "p99 ms", "mean ms"):
        table.add_column(col, justify="right" if col != "path" else "left")
    for name, r in rows:
        table.add_row(
            name, *(f"{r[k]:.{digits}f}" for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms"))
        )
    return table


def print_latency(results: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    rows = [("orchard (client → server → agent)", results["orchard"])]
    if "agent_direct" in results:
        rows.append(("agent direct (no orchestrator)", results["agent_direct"]))
    rows.append((results["baseline_name"], results["baseline"]))
    title = f"exec round trip of {results['command']!r}, {results['runs']} runs"
    console.print(_table(title, rows, 2))
    console.print(f"ratio p50 orchard / baseline: {results['ratio_p50']:.2f}")
    if "orchestrator_overhead_p50_ms" in results:
        console.print(f"orchestrator adds {results['orchestrator_overhead_p50_ms']:.2f} ms at p50")


def print_create(results: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    rows = [("orchard create → first command", results["orchard"])]
    if "baseline" in results:
        rows.append((results["baseline_name"], results["baseline"]))
    title = f"create → ready on {results['backend']}, {results['runs']} runs"
    console.print(_table(title, rows, 1))
    if "ratio_p50" in results:
        console.print(f"ratio p50 orchard / baseline: {results['ratio_p50']:.2f}")

"""``bench latency``: the exec round trip and file throughput, next to direct baselines.

Every number comes from one run on this machine: the full path (client → orchestrator →
agent → process), the agent called directly (no orchestrator), and the baseline — a bare
process spawn of the same command locally, ``docker exec`` in the same container on
Docker. File throughput moves 1 MB and 100 MB each way through the raw ``/fs`` stream.
With the bench's own server, the plain HTTP call to the server, the one to the agent and
the baseline take turns in every round, so the agent-side exec p50 over the bare spawn's
(issue 21's figure, target 1.5x on the local backend) compares numbers of the same moments.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from orchard_env_client import Sandbox, SandboxClient

from .common import (
    OwnServer,
    default_image,
    latency_table,
    machine_facts,
    plot_percentile_bars,
    time_interleaved,
)
from .common import time_calls as _time
from .targets import figure, print_figures

FILE_SIZES = (1 << 20, 100 << 20)
AGENT_TARGET_RATIO = 1.5  # issue 21: agent-side exec p50 within 1.5x of a bare spawn


def bench_latency(
    url: str | None,
    backend: str,
    runs: int,
    command: str,
    image: str | None = None,
    file_runs: int = 3,
) -> dict[str, Any]:
    """Measure; the result's JSON keys are documented in docs/performance.md."""
    image = default_image(backend, image)
    own = None if url else OwnServer(backend)
    base = url or own.url  # type: ignore[union-attr]
    results: dict[str, Any] = {
        "bench": "latency",
        "backend": backend,
        "runs": runs,
        "command": command,
        "image": image,
        "machine": machine_facts(),
    }
    try:
        with SandboxClient(base_url=base) as client:
            sandbox = client.create_sandbox(image)
            results["orchard"] = _time("orchard exec", runs, lambda: sandbox.exec(command))
            argv, results["baseline_name"] = _baseline(backend, sandbox.sandbox_id, command)
            _check_baseline(argv, sandbox.exec(command).exit_code)

            def spawn() -> None:
                subprocess.run(argv, check=False, capture_output=True)

            agent = _direct_agent(own.state_dir, sandbox.sandbox_id) if own else None
            if agent is not None:  # the baseline interleaved with the agent and the server
                results.update(
                    _orchestrator_vs_agent(base, sandbox.sandbox_id, agent, command, runs, spawn)
                )
            else:
                results["baseline"] = _time("baseline", runs, spawn)
            if file_runs > 0:
                results["files"] = _file_throughput(sandbox, file_runs)
            sandbox.delete()
    finally:
        if own:
            own.close()
    results["ratio_p50"] = results["orchard"]["p50_ms"] / results["baseline"]["p50_ms"]
    if "agent_direct" in results:
        results["orchestrator_overhead_p50_ms"] = (
            results["orchard_http"]["p50_ms"] - results["agent_direct"]["p50_ms"]
        )
        results["agent_vs_baseline_p50"] = (
            results["agent_direct"]["p50_ms"] / results["baseline"]["p50_ms"]
        )
    results["figures"] = _figures(results)
    return results


def _figures(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 21: on the local backend the agent-side exec p50 within 1.5x of a bare
    ``bash -c`` spawn on the host (the agent called directly, no orchestrator)."""
    if results["backend"] != "local" or "agent_direct" not in results:
        return []
    return [
        figure(
            "agent-side exec p50 / bash -c spawn p50",
            results["agent_vs_baseline_p50"],
            "x",
            baseline=1.0,
            baseline_name=f"{results['baseline_name']}: {results['baseline']['p50_ms']:.2f} ms",
            target=AGENT_TARGET_RATIO,
        ),
        figure(
            "agent-side exec p50",
            results["agent_direct"]["p50_ms"],
            "ms",
            baseline=results["baseline"]["p50_ms"],
            baseline_name="bash -c spawn",
        ),
    ]


def _orchestrator_vs_agent(
    base: str,
    sandbox_id: str,
    agent: tuple[str, dict[str, str], str | None],
    command: str,
    runs: int,
    baseline: Callable[[], None],
) -> dict[str, Any]:
    """The same plain HTTP client calls the orchestrator and the agent, alternately, so the
    difference is the orchestrator's hop alone (not the SDK's, nor the machine's drift);
    the ``baseline`` spawn takes its turn in each round too."""
    agent_url, agent_headers, uds = agent
    body = {"command": command, "wait": True}
    key = os.environ.get("ORCHARD_ENV_API_KEY")
    with (
        httpx.Client(transport=httpx.HTTPTransport(uds=uds) if uds else None) as to_agent,
        httpx.Client(base_url=base, headers={"X-API-Key": key} if key else {}) as to_orchard,
    ):
        calls = {
            "orchard_http": lambda: to_orchard.post(f"/sandboxes/{sandbox_id}/exec", json=body),
            "agent_direct": lambda: to_agent.post(
                agent_url + "/exec", json=body, headers=agent_headers
            ),
            "baseline": baseline,
        }
        return time_interleaved("server, agent and baseline, alternated", runs, calls)


def _check_baseline(argv: list[str], expected: int | None) -> None:
    """A baseline that fails where Orchard's run succeeds would time an error: refuse."""
    done = subprocess.run(argv, check=False, capture_output=True)
    if done.returncode != expected:
        raise RuntimeError(
            f"the baseline {' '.join(argv[:4])} ... exited {done.returncode}, the command "
            f"through Orchard {expected}: {done.stderr.decode(errors='replace')[-500:]}"
        )


def _baseline(backend: str, sandbox_id: str, command: str) -> tuple[list[str], str]:
    """The direct way to run ``command`` in the same place, without Orchard."""
    if backend == "docker":
        argv = ["docker", "exec", f"orchard-{sandbox_id}", "sh", "-c", command]
        return argv, "docker exec <container> sh -c command"
    if backend == "kubernetes":
        from orchard_env_server.backends.kubernetes.spec import object_name

        kubectl = os.environ.get("KUBECTL") or shutil.which("kubectl") or "kubectl"
        namespace = os.environ.get("ORCHARD_ENV_NAMESPACE", "orchard-sandboxes")
        argv = [
            kubectl,
            "exec",
            "-n",
            namespace,
            object_name(sandbox_id),
            "-c",
            "sandbox",
            "--",
            "sh",
            "-c",
            command,
        ]
        return argv, "kubectl exec <pod> -- sh -c command ($KUBECTL, $KUBECONFIG)"
    return ["bash", "-c", command], "subprocess.run(['bash', '-c', command])"


def _file_throughput(sandbox: Sandbox, runs: int) -> dict[str, Any]:
    """MB/s of raw upload and download (best and median of ``runs``) per size."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="orchard-bench-files-") as tmp:
        for size in FILE_SIZES:
            source = Path(tmp) / f"up-{size}"
            back = Path(tmp) / f"down-{size}"
            with source.open("wb") as fh:  # incompressible, binary
                left = size
                while left:
                    chunk = os.urandom(min(left, 1 << 20))
                    fh.write(chunk)
                    left -= len(chunk)
            remote = f"/workspace/bench-{size}"
            up, down = [], []
            for _ in range(runs):
                started = time.perf_counter()
                sandbox.upload_file(source, remote)
                up.append(time.perf_counter() - started)
                started = time.perf_counter()
                sandbox.download_file(remote, back)
                down.append(time.perf_counter() - started)
            if back.stat().st_size != size:
                raise RuntimeError(f"downloaded {back.stat().st_size} bytes, uploaded {size}")
            sandbox.exec(["rm", "-f", remote])
            mb = size / 1e6
            out[f"{size >> 20}MiB"] = {
                "bytes": size,
                "upload_mb_s": mb / sorted(up)[len(up) // 2],
                "download_mb_s": mb / sorted(down)[len(down) // 2],
                "upload_best_mb_s": mb / min(up),
                "download_best_mb_s": mb / min(down),
            }
    return out


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


def print_latency(results: dict[str, Any], out: Console | None = None) -> None:
    """The rich tables of a ``bench_latency`` result."""
    out = out or Console()
    rows = [("orchard (SDK → server → agent)", results["orchard"])]
    if "agent_direct" in results:
        rows.append(("orchard (plain HTTP → server → agent)", results["orchard_http"]))
        rows.append(("agent direct (plain HTTP)", results["agent_direct"]))
    rows.append((results["baseline_name"], results["baseline"]))
    title = (
        f"exec round trip of {results['command']!r} on {results['backend']}, {results['runs']} runs"
    )
    out.print(latency_table(title, rows, 2))
    speedup = 1 / results["ratio_p50"] if results["ratio_p50"] else float("inf")
    out.print(
        f"ratio p50 orchard / baseline: {results['ratio_p50']:.3f} ({speedup:.1f}x the baseline's speed)"
    )
    if "orchestrator_overhead_p50_ms" in results:
        out.print(
            f"orchestrator adds {results['orchestrator_overhead_p50_ms']:.2f} ms at p50 "
            "(plain HTTP to the server minus plain HTTP to the agent, calls alternated)"
        )
    print_figures(results.get("figures", []), out)
    if "files" in results:
        from rich.table import Table

        table = Table(title="raw file transfer through the orchestrator (median of runs)")
        for col in ("size", "upload MB/s", "download MB/s", "best up", "best down"):
            table.add_column(col, justify="right")
        for name, r in results["files"].items():
            table.add_row(
                name,
                *(
                    f"{r[k]:.0f}"
                    for k in (
                        "upload_mb_s",
                        "download_mb_s",
                        "upload_best_mb_s",
                        "download_best_mb_s",
                    )
                ),
            )
        out.print(table)


def plot_latency(results: dict[str, Any], path: Path) -> None:
    """A bar chart of p50/p90/p99 per path, saved as PNG."""
    paths = [
        ("orchard", "orchard SDK"),
        ("orchard_http", "orchard HTTP"),
        ("agent_direct", "agent direct"),
        ("baseline", results["baseline_name"].split(" <")[0].split("(")[0]),
    ]
    present = [(key, label) for key, label in paths if key in results]
    plot_percentile_bars(
        results,
        present,
        path,
        title=f"exec round trip of {results['command']!r} on {results['backend']}",
        ylabel="ms per command",
        quantiles=("p50_ms", "p90_ms", "p99_ms"),
        width=0.26,
        figsize=(7, 3.6),
    )

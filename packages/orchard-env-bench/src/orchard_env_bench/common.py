"""What every bench shares: percentiles, a throwaway server, tables and plots."""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.progress import track
from rich.table import Table

DEFAULT_IMAGES = {
    "local": "host",
    "docker": "orchard-test/debian",
    "kubernetes": "orchard-test/debian",
}


def default_image(backend: str, image: str | None) -> str:
    """The image a bench uses: ``image`` if given, else the backend's test image."""
    if image:
        return image
    try:
        return DEFAULT_IMAGES[backend]
    except KeyError:
        raise ValueError(f"no default image for backend {backend!r}: pass --image") from None


def percentiles(samples_s: Sequence[float]) -> dict[str, float]:
    """p50/p90/p95/p99, mean and max of durations in seconds, reported in milliseconds."""
    if not samples_s:
        return {
            "p50_ms": 0.0,
            "p90_ms": 0.0,
            "p95_ms": 0.0,
            "p99_ms": 0.0,
            "mean_ms": 0.0,
            "max_ms": 0.0,
        }
    ordered = sorted(samples_s)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {
        "p50_ms": pick(0.50),
        "p90_ms": pick(0.90),
        "p95_ms": pick(0.95),
        "p99_ms": pick(0.99),
        "mean_ms": statistics.fmean(ordered) * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def time_calls(label: str, runs: int, call: Callable[[], Any]) -> dict[str, float]:
    """Percentiles of ``runs`` calls after one warm-up call, with a progress bar."""
    call()  # warm up connections and caches
    samples = []
    for _ in track(range(runs), description=label, transient=True):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return percentiles(samples)


def time_interleaved(
    label: str, runs: int, calls: dict[str, Callable[[], Any]]
) -> dict[str, dict[str, float]]:
    """Percentiles per call of ``runs`` rounds, each round calling every one in turn (so a
    busy moment of the machine lands on all of them alike), after one warm-up round."""
    for call in calls.values():
        call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in track(range(runs), description=label, transient=True):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - started)
    return {name: percentiles(values) for name, values in samples.items()}


class OwnServer:
    """A throwaway orchestrator on a free loopback port, for benches not given ``--url``.

    ``ORCHARD_ENV_*`` variables of the caller (namespace, kubeconfig, ...) pass through.
    """

    def __init__(self, backend: str, extra_args: Sequence[str] = ()) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self._state = tempfile.TemporaryDirectory(prefix="orchard-bench-")
        self.state_dir = Path(self._state.name) / "s"
        self._log = open(Path(self._state.name) / "server.log", "wb")  # noqa: SIM115
        argv = [
            sys.executable,
            "-m",
            "orchard_env_server.cli",
            "serve",
            "--backend",
            backend,
            "--port",
            str(self.port),
            "--state-dir",
            str(self.state_dir),
            "--log-level",
            "warning",
            *extra_args,
        ]
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        self.close()
        raise RuntimeError(f"the bench's own server did not start: {self.log_tail()}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return (Path(self._state.name) / "server.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self._state.cleanup()


def local_agent_pid(state_dir: Path) -> int | None:
    """The local backend's shared agent process, from the server's state dir."""
    import json

    try:
        return int(json.loads((state_dir / "agent.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def machine_facts() -> dict[str, Any]:
    """The machine a result was measured on, stored with every JSON result."""
    return {
        "cpu_count": os.cpu_count(),
        "memory_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "python": sys.version.split()[0],
    }


def latency_table(title: str, rows: list[tuple[str, dict[str, float]]], digits: int) -> Table:
    """A table of percentile dicts, one row per path."""
    table = Table(title=title)
    for col in ("path", "p50 ms", "p90 ms", "p99 ms", "mean ms"):
        table.add_column(col, justify="right" if col != "path" else "left")
    for name, r in rows:
        table.add_row(
            name, *(f"{r[k]:.{digits}f}" for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms"))
        )
    return table


def pyplot() -> Any:
    """matplotlib's pyplot on the non-interactive backend, or a clear error."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'orchard-env-bench[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_percentile_bars(
    results: dict[str, Any],
    present: Sequence[tuple[str, str]],
    path: Path,
    *,
    title: str,
    ylabel: str = "ms",
    quantiles: Sequence[str] = ("p50_ms", "p99_ms"),
    width: float = 0.35,
    figsize: tuple[float, float] = (6, 3.4),
) -> None:
    """Grouped bars of ``quantiles`` for each ``(results key, label)`` in ``present``, as PNG."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=figsize, dpi=110)
    middle = (len(quantiles) - 1) / 2
    for i, q in enumerate(quantiles):
        xs = [j + (i - middle) * width for j in range(len(present))]
        ax.bar(xs, [results[key][q] for key, _ in present], width, label=q.split("_")[0])
    ax.set_xticks(range(len(present)), [label for _, label in present])
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

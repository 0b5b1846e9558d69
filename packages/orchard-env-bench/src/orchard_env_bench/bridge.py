"""``bench bridge``: a service bridge's round trip from inside a sandbox, next to calling the
same upstream directly on the host.

An HTTP upstream answering a small JSON body runs on the host's 127.0.0.1; a sandbox with
``bridges={4000: <upstream>}`` calls ``http://127.0.0.1:4000/`` ``runs`` times (python3's
urllib, a new connection each time, as most harness SDKs do per call without keep-alive)
and reports its own timings; the host then makes the same calls directly. The image needs
python3 (``host`` and ``orchard-test/debian`` have it).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rich.console import Console

from orchard_env_client import SandboxClient

from .common import (
    OwnServer,
    default_image,
    latency_table,
    machine_facts,
    percentiles,
    plot_percentile_bars,
)

BRIDGE_PORT = 4000
_BODY = b'{"ok": true}'

# Runs inside the sandbox: the timings of ``runs`` calls through the bridge, as JSON.
_PROBE = """
import json, sys, time, urllib.request
runs, url = int(sys.argv[1]), sys.argv[2]
urllib.request.urlopen(url).read()
out = []
for _ in range(runs):
    t = time.perf_counter()
    urllib.request.urlopen(url).read()
    out.append(time.perf_counter() - t)
print(json.dumps(out))
"""


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(_BODY)))
        self.end_headers()
        self.wfile.write(_BODY)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _direct(url: str, runs: int) -> list[float]:
    urllib.request.urlopen(url).read()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        urllib.request.urlopen(url).read()
        samples.append(time.perf_counter() - started)
    return samples


def bench_bridge(
    url: str | None, backend: str, runs: int, image: str | None = None
) -> dict[str, Any]:
    """The bridge's round trip from inside a sandbox and the direct call on the host."""
    image = default_image(backend, image)
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    target = f"http://127.0.0.1:{upstream.server_port}"
    own = None if url else OwnServer(backend)
    base = url or own.url  # type: ignore[union-attr]
    results: dict[str, Any] = {
        "bench": "bridge",
        "backend": backend,
        "runs": runs,
        "image": image,
        "machine": machine_facts(),
    }
    try:
        with SandboxClient(base_url=base) as client:
            sandbox = client.create_sandbox(image, bridges={BRIDGE_PORT: target})
            try:
                job = sandbox.exec(
                    ["python3", "-c", _PROBE, str(runs), f"http://127.0.0.1:{BRIDGE_PORT}/"],
                    timeout=600,
                )
            finally:
                sandbox.delete()
        if job.exit_code != 0:
            raise RuntimeError(f"the probe failed in the sandbox: {job.stderr[-2000:]}")
        results["orchard"] = percentiles(json.loads(job.stdout))
        results["baseline"] = percentiles(_direct(target + "/", runs))
    finally:
        upstream.shutdown()
        if own:
            own.close()
    results["baseline_name"] = "the same call on the host, direct"
    results["ratio_p50"] = results["orchard"]["p50_ms"] / results["baseline"]["p50_ms"]
    results["overhead_p50_ms"] = results["orchard"]["p50_ms"] - results["baseline"]["p50_ms"]
    return results


def print_bridge(results: dict[str, Any], out: Console | None = None) -> None:
    """The rich table of a ``bench_bridge`` result."""
    out = out or Console()
    rows = [
        ("bridge, from inside the sandbox", results["orchard"]),
        (results["baseline_name"], results["baseline"]),
    ]
    title = (
        f"bridge round trip on {results['backend']} ({results['image']}), {results['runs']} runs"
    )
    out.print(latency_table(title, rows, 2))
    out.print(
        f"ratio p50 bridge / direct: {results['ratio_p50']:.1f}; "
        f"overhead p50 {results['overhead_p50_ms']:.2f} ms"
    )


def plot_bridge(results: dict[str, Any], path: Path) -> None:
    """p50/p99 bars of the bridge next to the direct call, saved as PNG."""
    present = [("orchard", "bridge"), ("baseline", "direct")]
    plot_percentile_bars(results, present, path, title=f"bridge round trip on {results['backend']}")

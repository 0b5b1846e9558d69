"""``bench create``: create → ready, one sandbox at a time, next to the bare tool underneath.

Orchard's figure is create → the first command (``true``) answered, then delete (not
timed). The baseline is what the backend itself builds on, measured in the same run and
interleaved with Orchard's creates (one each per round), so a busy moment lands on both:

- local: a bare ``bwrap`` running ``/bin/true`` with the holder's own arguments
  (``backends.local.bubblewrap.holder_argv``: new user, mount, pid, ipc, uts, net and
  cgroup namespaces, the image ``host``'s view of read-only binds, ``/dev``, ``/proc``,
  ``/workspace`` and ``/tmp`` binds, cleared env, the sandbox's seccomp filter when the
  bench's own server has written one), as root with bwrap mapping its own uid. What it
  leaves out is Orchard's own work: the uid range claim and map, ``orchard-enter
  --stage``, the cgroups, the record and the registration with the agent.
- Docker and Kubernetes: ``docker run -d`` of the same image with the agent injected the
  way the Docker backend does it (the bundle's volume read-only at ``/.orchard/agent``, a
  run dir bound at ``/.orchard/run`` with a token, the backend's confinement flags and
  ``--network none``), then the agent's ``/health`` polled over its unix socket and one
  ``POST /exec true``: the container plus the agent's start, without the orchestrator.
  Without the agent's volume (no Docker backend ever started here) it falls back to
  ``docker run --rm <image> true``, and says so in ``baseline_name``.

``--concurrent N`` (Docker): N creates at once through the SDK against a loop of N
``docker run -d`` of the same injected container (no health wait: the plain engine call a
script would make); the figures are creates per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import track

from orchard_env_client import AsyncSandboxClient, SandboxClient, pooled_transport

from .common import (
    OwnServer,
    default_image,
    latency_table,
    machine_facts,
    percentiles,
    plot_percentile_bars,
)
from .pool import POOL_TARGET_P50_MS, bench_pool, server_pss_bytes
from .targets import figure, print_figures

LOCAL_TARGET_P50_MS = 60.0
DOCKER_TARGET_RATIO = 1.2


def bench_create(
    url: str | None,
    backend: str,
    runs: int,
    image: str | None = None,
    concurrent: int | None = None,
    warm_pool: int | None = None,
) -> dict[str, Any]:
    """Orchard's create → first command next to the backend's bare baseline (module doc);
    with ``concurrent``, also N creates at once next to a ``docker run -d`` loop; with
    ``warm_pool`` (local), also creates served from a pool of that size (``pool``)."""
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
    scratch = tempfile.TemporaryDirectory(prefix="orchard-bench-create-")
    try:
        baseline, results["baseline_name"] = _baseline(backend, image, own, Path(scratch.name))
        with SandboxClient(base_url=base) as client:
            orchard = _orchard_create(client, image)
            orchard()  # warm up
            if baseline is not None:
                baseline()
            samples = _interleave(runs, orchard, baseline)
        results["orchard"] = percentiles(samples["orchard"])
        if baseline is not None:
            results["baseline"] = percentiles(samples["baseline"])
            results["ratio_p50"] = results["orchard"]["p50_ms"] / results["baseline"]["p50_ms"]
        if concurrent:
            results["concurrent"] = _concurrent(base, backend, image, concurrent)
        if warm_pool and backend == "local":
            idle = server_pss_bytes(own.pid) if own is not None else None
            results["warm_pool"] = bench_pool(image, warm_pool, runs, idle)
    finally:
        if own:
            own.close()
        scratch.cleanup()
    results["figures"] = _figures(results)
    return results


def _orchard_create(client: SandboxClient, image: str) -> Callable[[], float]:
    def once() -> float:
        started = time.perf_counter()
        sandbox = client.create_sandbox(image)
        sandbox.exec("true")  # ready means it runs commands: prove it
        took = time.perf_counter() - started
        sandbox.delete()
        return took

    return once


def _interleave(
    runs: int, orchard: Callable[[], float], baseline: Callable[[], float] | None
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"orchard": [], "baseline": []}
    for _ in track(range(runs), description="create → ready (and baseline)", transient=True):
        samples["orchard"].append(orchard())
        if baseline is not None:
            samples["baseline"].append(baseline())
    return samples


def _baseline(
    backend: str, image: str, own: OwnServer | None, scratch: Path
) -> tuple[Callable[[], float] | None, str]:
    """The timed baseline call for this backend and image, and its name."""
    if backend == "local" and not _stored_image(image):
        return _bwrap_baseline(own.state_dir if own else None, scratch)
    if backend in ("docker", "kubernetes") or _stored_image(image):
        volume = _agent_volume()
        if volume is None:
            argv = ["docker", "run", "--rm", "--network", "none", image, "true"]
            return _timed_run(argv), "docker run --rm <image> true (no agent volume found)"
        return _docker_agent_baseline(image, volume, scratch), (
            "docker run -d <image> + injected agent, /health, one /exec"
        )
    return None, ""


def _timed_run(argv: list[str]) -> Callable[[], float]:
    def once() -> float:
        started = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        return time.perf_counter() - started

    return once


# -- local: a bare bwrap ---------------------------------------------------------------
def bwrap_true_argv(workdir: Path, state_dir: Path | None, fds: dict[str, int]) -> list[str]:
    """The holder's bwrap arguments for the image ``host`` (``holder_argv``), running
    ``/bin/true`` instead of the holder's sleep loop; ``fds`` has ``info`` and
    ``seccomp``, the latter dropped (no ``--seccomp``) when it is -1."""
    from orchard_env_server.backends.local.bubblewrap import (
        HolderSpec,
        bind_mounts,
        bwrap_path,
        holder_argv,
    )
    from orchard_env_server.backends.local.host_view import host_view

    etc = Path("/etc")
    if state_dir is not None:  # the server's curated /etc copy, as its sandboxes see it
        copies = sorted(state_dir.glob("etc-*"))
        etc = copies[0] if copies else etc
    spec = HolderSpec(
        sandbox_id="bench-bwrap",
        bwrap=bwrap_path() or "bwrap",
        view=host_view(etc, [], [state_dir] if state_dir else []),
        workspace=workdir / "workspace",
        tmp=workdir / "tmp",
        seccomp=Path("/dev/null"),
        resolv_conf=None,
    )
    argv = holder_argv(spec, [str(source) for _, source, _ in bind_mounts(spec)], fds)
    if fds["seccomp"] < 0:
        at = argv.index("--seccomp")
        del argv[at : at + 2]
    end = len(argv) - 1 - argv[::-1].index("--")
    return [*argv[: end + 1], "/bin/true"]


@contextlib.contextmanager
def _bwrap_fds(seccomp: Path | None) -> Iterator[dict[str, int]]:
    """A fresh seccomp fd per run (bwrap reads it to its end) and an info fd."""
    fds = {"info": os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC), "seccomp": -1}
    try:
        if seccomp is not None and seccomp.is_file():
            fds["seccomp"] = os.open(seccomp, os.O_RDONLY | os.O_CLOEXEC)
        yield fds
    finally:
        for fd in fds.values():
            if fd >= 0:
                os.close(fd)


def _bwrap_baseline(state_dir: Path | None, workdir: Path) -> tuple[Callable[[], float], str]:
    for name in ("workspace", "tmp"):
        (workdir / name).mkdir()
    seccomp = state_dir / "seccomp.bpf" if state_dir else None

    def once() -> float:
        with _bwrap_fds(seccomp) as fds:
            argv = bwrap_true_argv(workdir, state_dir, fds)
            started = time.perf_counter()
            subprocess.run(
                argv, check=True, capture_output=True, pass_fds=tuple(fds.values()), timeout=30
            )
            return time.perf_counter() - started

    with _bwrap_fds(seccomp) as fds:
        flags = "seccomp" if fds["seccomp"] >= 0 else "no seccomp"
    return once, f"bare bwrap … /bin/true (holder's namespaces and view, {flags})"


# -- Docker: docker run -d with the agent injected -------------------------------------
def _agent_volume() -> str | None:
    """The agent bundle's volume a Docker backend prepared (``orchard-agent-<id>``)."""
    from orchard_env_server.backends.injection import label

    if shutil.which("docker") is None:
        return None
    listed = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"label={label('agent-image')}"],
        capture_output=True,
        text=True,
        check=False,
    )
    names = listed.stdout.split()
    return names[0] if listed.returncode == 0 and names else None


def docker_agent_argv(image: str, volume: str, run_dir: Path, name: str) -> list[str]:
    """``docker run -d`` of ``image`` with the agent started as the Docker backend starts
    it (``docker.spec.container_spec``): same entry, mounts, confinement and socket."""
    from orchard_env_server.backends.hardening import SANDBOX_CAPABILITIES
    from orchard_env_server.backends.injection import AGENT_MOUNT, RUN_MOUNT, agent_entry

    entry = agent_entry()
    argv = ["docker", "run", "-d", "--name", name, "--network", "none", "--cap-drop", "ALL"]
    for cap in SANDBOX_CAPABILITIES:
        argv += ["--cap-add", cap]
    argv += ["--security-opt", "no-new-privileges", "--pids-limit", "1024"]
    argv += [
        "--mount",
        f"type=volume,src={volume},dst={AGENT_MOUNT},readonly,volume-nocopy",
        "--mount",
        f"type=bind,src={run_dir},dst={RUN_MOUNT}",
        "--entrypoint",
        entry[0],
        image,
        *entry[1:],
        "--uds",
        f"{RUN_MOUNT}/agent.sock",
        "--token-file",
        f"{RUN_MOUNT}/token",
    ]
    return argv


def _run_dir(parent: Path, name: str) -> Path:
    run_dir = parent / name
    run_dir.mkdir()
    run_dir.chmod(0o777)
    (run_dir / "token").write_text("bench-token")
    (run_dir / "token").chmod(0o644)
    return run_dir


def _agent_ready(run_dir: Path, deadline_s: float = 60.0) -> None:
    """Poll the agent's /health over its socket, then run ``true`` once through it."""
    sock = run_dir / "agent.sock"
    deadline = time.monotonic() + deadline_s
    headers = {"Authorization": "Bearer bench-token"}
    while time.monotonic() < deadline:
        if sock.exists():
            with (
                contextlib.suppress(httpx.TransportError),
                httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))) as http,
            ):
                if http.get("http://sandbox/health", timeout=2).status_code == 200:
                    done = http.post(
                        "http://sandbox/exec",
                        json={"command": "true", "wait": True},
                        headers=headers,
                        timeout=30,
                    )
                    done.raise_for_status()
                    return
        time.sleep(0.005)
    raise RuntimeError(f"the baseline's agent did not answer in {deadline_s:.0f} s")


def _docker_agent_baseline(image: str, volume: str, parent: Path) -> Callable[[], float]:
    parent.chmod(0o755)
    count = iter(range(1 << 30))

    def once() -> float:
        name = f"orchard-bench-baseline-{os.getpid()}-{next(count)}"
        run_dir = _run_dir(parent, name)
        try:
            started = time.perf_counter()
            subprocess.run(
                docker_agent_argv(image, volume, run_dir, name), check=True, capture_output=True
            )
            _agent_ready(run_dir)
            return time.perf_counter() - started
        finally:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
            shutil.rmtree(run_dir, ignore_errors=True)

    return once


# -- N creates at once against a docker run -d loop ------------------------------------
async def _orchard_burst(base: str, image: str, n: int) -> tuple[float, list[str]]:
    """Wall time of ``n`` creates at once (each until ready), and why those that failed did."""
    clients = [
        AsyncSandboxClient(base, timeout=900, transport=pooled_transport(16))
        for _ in range(-(-n // 16))
    ]
    async with contextlib.AsyncExitStack() as stack:
        for c in clients:
            await stack.enter_async_context(c)
        started = time.perf_counter()
        made = await asyncio.gather(
            *(clients[i % len(clients)].create_sandbox(image, timeout=900) for i in range(n)),
            return_exceptions=True,
        )
        wall = time.perf_counter() - started
        ok = [s for s in made if not isinstance(s, BaseException)]
        await asyncio.gather(*(s.delete() for s in ok), return_exceptions=True)
    return wall, [repr(s)[:300] for s in made if isinstance(s, BaseException)]


def _docker_loop(image: str, n: int) -> float:
    """Wall time of ``n`` sequential ``docker run -d`` of the injected container."""
    volume = _agent_volume()
    parent = Path(tempfile.mkdtemp(prefix="orchard-bench-loop-"))
    parent.chmod(0o755)
    names = [f"orchard-bench-loop-{os.getpid()}-{i}" for i in range(n)]
    try:
        started = time.perf_counter()
        for name in track(names, description="docker run -d loop", transient=True):
            if volume is None:
                argv = [
                    "docker",
                    "run",
                    "-d",
                    "--name",
                    name,
                    "--network",
                    "none",
                    image,
                    "sleep",
                    "600",
                ]
            else:
                argv = docker_agent_argv(image, volume, _run_dir(parent, name), name)
            subprocess.run(argv, check=True, capture_output=True)
        return time.perf_counter() - started
    finally:
        for i in range(0, n, 50):
            subprocess.run(
                ["docker", "rm", "-f", *names[i : i + 50]], capture_output=True, check=False
            )
        shutil.rmtree(parent, ignore_errors=True)


def _concurrent(base: str, backend: str, image: str, n: int) -> dict[str, Any]:
    if backend not in ("docker", "kubernetes"):
        raise SystemExit("--concurrent compares against a docker run -d loop: use --backend docker")
    wall, errors = asyncio.run(_orchard_burst(base, image, n))
    failed = len(errors)
    loop_wall = _docker_loop(image, n)
    return {
        "count": n,
        "orchard_wall_s": wall,
        "orchard_failed": failed,
        "orchard_errors": errors[:10],
        "orchard_creates_per_s": (n - failed) / wall if wall else 0.0,
        "baseline_wall_s": loop_wall,
        "baseline_creates_per_s": n / loop_wall if loop_wall else 0.0,
        "baseline_name": f"a loop of {n} docker run -d (agent injected, no health wait)",
    }


def _stored_image(image: str) -> bool:
    """A local-backend image that is a registry reference, not ``host`` or a directory."""
    return image != "host" and not image.startswith("/")


def _figures(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 21's create targets: local p50 ≤ 60 ms (beside bare bwrap), Docker ≤ 1.2x its
    baseline, and creates/s of N at once beside the docker run -d loop."""
    figures: list[dict[str, Any]] = []
    base = results.get("baseline", {}).get("p50_ms")
    name = results.get("baseline_name", "")
    p50 = results["orchard"]["p50_ms"]
    if results["backend"] == "local":
        figures.append(
            figure(
                "local create → ready p50",
                p50,
                "ms",
                baseline=base,
                baseline_name=name,
                target=LOCAL_TARGET_P50_MS,
            )
        )
        figures.append(
            figure(
                "local create → ready p95",
                results["orchard"].get("p95_ms"),
                "ms",
                baseline=results.get("baseline", {}).get("p95_ms"),
                baseline_name="same baseline, p95",
            )
        )
    elif base:
        figures.append(
            figure(
                f"{results['backend']} create → ready p50 / baseline",
                p50 / base,
                "x",
                baseline=1.0,
                baseline_name=f"{name}: {base:.0f} ms",
                target=DOCKER_TARGET_RATIO,
            )
        )
    pool = results.get("warm_pool")
    if pool:
        figures.append(
            figure(
                f"create → ready p50 from a warm pool of {pool['size']}",
                pool["ready"]["p50_ms"],
                "ms",
                baseline=p50,
                baseline_name="an ordinary create → first command, this run",
                target=POOL_TARGET_P50_MS,
            )
        )
        figures.append(
            figure(
                "create → first command p50 from the pool",
                pool["orchard"]["p50_ms"],
                "ms",
                baseline=p50,
                baseline_name="the same, ordinary create",
            )
        )
        figures.append(
            figure(
                "memory per pooled sandbox (server tree PSS)",
                pool["pss_per_pooled_sandbox_bytes"] / 2**20
                if pool["pss_per_pooled_sandbox_bytes"] is not None
                else None,
                "MiB",
                target_text="report (no target)",
            )
        )
    burst = results.get("concurrent")
    if burst:
        figures.append(
            figure(
                f"creates/s, {burst['count']} at once",
                burst["orchard_creates_per_s"],
                "/s",
                baseline=burst["baseline_creates_per_s"],
                baseline_name=burst["baseline_name"],
                target_text="report (no target)",
            )
        )
    return figures


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
    pool = results.get("warm_pool")
    if pool:
        out.print(
            latency_table(
                f"from a warm pool of {pool['size']}",
                [
                    ("claim (create answered ready)", pool["ready"]),
                    ("claim → first command", pool["orchard"]),
                ],
                1,
            )
        )
    burst = results.get("concurrent")
    if burst:
        out.print(
            f"{burst['count']} creates at once: {burst['orchard_creates_per_s']:.1f}/s "
            f"({burst['orchard_wall_s']:.1f} s, {burst['orchard_failed']} failed); "
            f"{burst['baseline_name']}: {burst['baseline_creates_per_s']:.1f}/s "
            f"({burst['baseline_wall_s']:.1f} s)"
        )
        for error in burst.get("orchard_errors", [])[:3]:
            out.print(f"[red]error:[/red] {error}")
    print_figures(results.get("figures", []), out)


def plot_create(results: dict[str, Any], path: Path) -> None:
    """p50/p99 bars of create → ready next to the baseline, saved as PNG."""
    present = [("orchard", "orchard")] + (
        [("baseline", results["baseline_name"].split(" (")[0][:24])]
        if "baseline" in results
        else []
    )
    plot_percentile_bars(results, present, path, title=f"create → ready on {results['backend']}")

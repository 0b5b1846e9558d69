"""``bench concurrency``: N sandboxes alive at once, M commands in each, then delete all.

Three phases, each timed: create all N at once (each waits until ready), run M commands
in every sandbox (sequential within a sandbox, all sandboxes concurrently; each output is
checked), delete all. A sandbox counts as a success only if it became ready, every one of
its commands printed what it should, and it was deleted. While it runs, a sampler records
the orchestrator's RSS, the local agent's RSS and the machine's used memory; the memory a
sandbox costs is the machine's used memory with all N alive minus before the first create,
divided by N (everything counted: holders or containers, agent, kernel). Where the bench
starts its own server, it also sums the proportional set size (PSS) of the server's
process tree (orchestrator, agent and every process under them: on the local backend, the
sandboxes themselves) before and after the creates: a per-sandbox figure that other
processes' memory churn cannot hide, as it can hide a few sandboxes in the machine's total.

Issue 21's figures come out beside their baselines and targets (``figures``): commands/s
over the whole run (the three phases), create → ready p99, the client-visible wall time of
deleting all N, memory per sandbox, the orchestrator's RSS at start, at peak and its growth
per sandbox, and, on the local backend with the bench's own server, what was left behind
(``leaks``: processes, cgroup dirs, mounts, sandbox dirs, uid claims; see ``leaks``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from orchard_env_client import AsyncSandbox, AsyncSandboxClient, pooled_transport

from . import leaks
from .common import (
    OwnServer,
    default_image,
    local_agent_pid,
    machine_facts,
    percentiles,
    pyplot,
)
from .targets import (
    ISSUE21_CREATE_P99_MS,
    ISSUE21_DELETE_WALL_S,
    ISSUE21_SOURCE,
    ISSUE21_SPAWN_P50_MS,
    ISSUE21_WHOLE_RUN_COMMANDS_PER_S,
    figure,
    print_figures,
    spawn_reference,
)


def tree_pss_bytes(roots: list[psutil.Process]) -> int | None:
    """The summed PSS of ``roots`` and all their descendants; None when there are none
    or one cannot be read."""
    if not roots:
        return None
    seen: dict[int, psutil.Process] = {}
    try:
        for proc in roots:
            seen[proc.pid] = proc
            seen.update((child.pid, child) for child in proc.children(recursive=True))
    except psutil.Error:
        return None
    total = 0
    for proc in seen.values():
        try:
            total += proc.memory_full_info().pss
        except psutil.NoSuchProcess:
            continue  # a process that ended meanwhile costs nothing now
        except (psutil.Error, AttributeError):
            return None
    return total


class MemorySampler:
    """Samples the RSS of given processes and the machine's used memory in a thread."""

    def __init__(self, pids: dict[str, int | None], interval_s: float = 0.25) -> None:
        self._procs = {name: psutil.Process(pid) for name, pid in pids.items() if pid}
        self._interval = interval_s
        self.peak_rss: dict[str, int] = dict.fromkeys(self._procs, 0)
        self.start_rss: dict[str, int] = {}
        self.used_series: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)
        self._t0 = time.monotonic()

    def tree_pss_bytes(self) -> int | None:
        """The summed PSS of the sampled processes and all their descendants."""
        return tree_pss_bytes(list(self._procs.values()))

    @staticmethod
    def used_bytes() -> int:
        vm = psutil.virtual_memory()
        return int(vm.total - vm.available)

    def sample(self) -> None:
        for name, proc in self._procs.items():
            with contextlib.suppress(psutil.Error):
                rss = proc.memory_info().rss
                self.start_rss.setdefault(name, rss)
                self.peak_rss[name] = max(self.peak_rss[name], rss)
        self.used_series.append((time.monotonic() - self._t0, self.used_bytes()))

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def __enter__(self) -> MemorySampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def _client(base_url: str, connections: int) -> AsyncSandboxClient:
    transport = pooled_transport(connections)
    return AsyncSandboxClient(base_url, timeout=900, transport=transport, auto_cleanup=True)


async def _run(
    base_url: str,
    image: str,
    sandboxes: int,
    commands: int,
    connections: int,
    parallel: int | None,
    sampler: MemorySampler | None,
    progress: Progress,
) -> dict[str, Any]:
    errors: list[str] = []
    create_s: list[float] = []
    command_s: list[float] = []
    alive: list[AsyncSandbox | None] = [None] * sandboxes
    ok = [True] * sandboxes
    phases: dict[str, float] = {}

    def fail(i: int, what: str, exc: BaseException | str) -> None:
        ok[i] = False
        if len(errors) < 20:
            errors.append(f"sandbox #{i} {what}: {exc!r}"[:300])

    # One client per `connections` sandboxes, like a fleet of harnesses: httpx's connection
    # pool costs CPU in proportion to its connections and queued requests, so a single
    # client carrying a thousand sandboxes would measure itself, not the service.
    clients = [_client(base_url, connections) for _ in range(-(-sandboxes // connections))]
    async with contextlib.AsyncExitStack() as stack:
        for c in clients:
            await stack.enter_async_context(c)
        client = clients[0]
        used_before = MemorySampler.used_bytes()
        pss_before = sampler.tree_pss_bytes() if sampler is not None else None
        t_create = progress.add_task("create → ready", total=sandboxes)

        async def create(i: int) -> None:
            started = time.perf_counter()
            try:
                alive[i] = await clients[i % len(clients)].create_sandbox(
                    image, labels={"bench": "concurrency"}, timeout=900
                )
                create_s.append(time.perf_counter() - started)
            except Exception as exc:
                fail(i, "create", exc)
            progress.advance(t_create)

        started = time.perf_counter()
        await asyncio.gather(*(create(i) for i in range(sandboxes)))
        phases["create_s"] = time.perf_counter() - started
        if sampler is not None:
            sampler.sample()
        used_full = MemorySampler.used_bytes()
        pss_full = sampler.tree_pss_bytes() if sampler is not None else None

        t_exec = progress.add_task("commands", total=sandboxes * commands)

        async def run_commands(i: int) -> None:
            sandbox = alive[i]
            if sandbox is None:
                progress.advance(t_exec, commands)
                return
            for j in range(commands):
                try:
                    async with gate:
                        began = time.perf_counter()
                        job = await sandbox.exec(f"echo {i}-{j}", timeout=600)
                        command_s.append(time.perf_counter() - began)
                    if job.exit_code != 0 or job.stdout != f"{i}-{j}\n":
                        fail(
                            i,
                            f"command {j}",
                            f"exit {job.exit_code}, stdout {job.stdout!r}, error {job.error!r}",
                        )
                except Exception as exc:
                    fail(i, f"command {j}", exc)
                progress.advance(t_exec)

        gate = asyncio.Semaphore(parallel or sandboxes)
        started = time.perf_counter()
        await asyncio.gather(*(run_commands(i) for i in range(sandboxes)))
        phases["commands_s"] = time.perf_counter() - started

        t_delete = progress.add_task("delete", total=sandboxes)

        async def delete(i: int) -> None:
            sandbox = alive[i]
            if sandbox is not None:
                try:
                    await sandbox.delete()
                except Exception as exc:
                    fail(i, "delete", exc)
            progress.advance(t_delete)

        started = time.perf_counter()
        await asyncio.gather(*(delete(i) for i in range(sandboxes)))
        phases["delete_s"] = time.perf_counter() - started
        leftover = await client.list_sandboxes(labels={"bench": "concurrency"})

    return {
        "errors": errors,
        "ok": ok,
        "create_s": create_s,
        "command_s": command_s,
        "phases": phases,
        "used_before": used_before,
        "used_full": used_full,
        "pss_before": pss_before,
        "pss_full": pss_full,
        "leftover": len(leftover),
    }


def bench_concurrency(
    url: str | None,
    backend: str,
    sandboxes: int,
    commands: int,
    image: str | None = None,
    connections: int = 16,
    quiet: bool = False,
    parallel: int | None = None,
) -> dict[str, Any]:
    """Run the bench; JSON keys: ``success_rate``, ``commands_per_s``, ``wall_s``, ...

    ``parallel`` bounds the commands in flight across all sandboxes (a harness's worker
    pool); by default every sandbox has one command in flight at all times.
    """
    image = default_image(backend, image)
    own = None if url else OwnServer(backend, ["--max-inflight", str(max(1024, 4 * sandboxes))])
    base = url or own.url  # type: ignore[union-attr]
    pids: dict[str, int | None] = {}
    before: set[int] = set()
    if own is not None:
        pids["orchestrator"] = own.pid
        if backend == "local":
            pids["agent"] = local_agent_pid(own.state_dir)
            before = leaks.descendants(own.pid)
    spawn_p50 = spawn_reference()
    started = time.perf_counter()
    try:
        with (
            MemorySampler(pids) as sampler,
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                disable=quiet,
                transient=True,
            ) as progress,
        ):
            raw = asyncio.run(
                _run(base, image, sandboxes, commands, connections, parallel, sampler, progress)
            )
        if own is not None and backend == "local":
            raw["leaks"] = leaks.settle(own.state_dir, own.pid, before)
    finally:
        if own:
            own.close()
    wall = time.perf_counter() - started
    succeeded = sum(raw["ok"])
    total_commands = len(raw["command_s"])
    results: dict[str, Any] = {
        "bench": "concurrency",
        "backend": backend,
        "image": image,
        "sandboxes": sandboxes,
        "commands_per_sandbox": commands,
        "commands_in_flight": parallel or sandboxes,
        "success_rate": succeeded / sandboxes if sandboxes else 1.0,
        "sandboxes_succeeded": succeeded,
        "commands_run": total_commands,
        "wall_s": wall,
        "commands_per_s": total_commands / raw["phases"]["commands_s"]
        if raw["phases"].get("commands_s")
        else 0.0,
        "commands_per_s_end_to_end": total_commands / wall if wall else 0.0,
        "phases_s": raw["phases"],
        "create_latency": percentiles(raw["create_s"]),
        "command_latency": percentiles(raw["command_s"]),
        "memory_used_before_bytes": raw["used_before"],
        "memory_used_all_alive_bytes": raw["used_full"],
        "per_sandbox_memory_bytes": max(0, raw["used_full"] - raw["used_before"])
        // max(1, succeeded),
        "per_sandbox_pss_bytes": (raw["pss_full"] - raw["pss_before"]) // max(1, succeeded)
        if raw["pss_before"] is not None and raw["pss_full"] is not None
        else None,
        "peak_rss_bytes": sampler.peak_rss,
        "orchestrator_peak_rss_bytes": sampler.peak_rss.get("orchestrator"),
        "sandboxes_left_after_delete": raw["leftover"],
        "errors": raw["errors"],
        "machine": machine_facts(),
        "_memory_series": sampler.used_series,
    }
    results.update(_rss_and_leaks(sampler, raw, succeeded))
    results["reference_spawn_p50_ms"] = spawn_p50
    results["figures"] = _figures(results)
    return results


def _rss_and_leaks(sampler: MemorySampler, raw: dict[str, Any], alive: int) -> dict[str, Any]:
    """The orchestrator's RSS at start / peak / growth per sandbox, whole-run commands/s
    (over the three phases, not the bench's start-up), the client-visible delete time and
    the leak counts (None where not counted: another backend, or a server given by URL)."""
    start = sampler.start_rss.get("orchestrator")
    peak = sampler.peak_rss.get("orchestrator")
    phases = raw["phases"]
    busy = sum(phases.get(k, 0.0) for k in ("create_s", "commands_s", "delete_s"))
    found = raw.get("leaks")
    return {
        "orchestrator_start_rss_bytes": start,
        "orchestrator_rss_growth_per_sandbox_bytes": (peak - start) / max(1, alive)
        if start is not None and peak is not None
        else None,
        "commands_per_s_whole_run": len(raw["command_s"]) / busy if busy else 0.0,
        "delete_wall_s": phases.get("delete_s"),
        "leaks": found,
        "leaks_total": sum(found["after"].values()) if found else None,
    }


def _figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 21's targets for this bench, beside the numbers the issue started from."""
    mib = float(1 << 20)
    pss = r.get("per_sandbox_pss_bytes")
    growth = r.get("orchestrator_rss_growth_per_sandbox_bytes")
    figures = [
        figure(
            "commands/s, whole run (create → delete)",
            r["commands_per_s_whole_run"],
            "/s",
            baseline=ISSUE21_WHOLE_RUN_COMMANDS_PER_S,
            baseline_name=ISSUE21_SOURCE,
            target=3 * ISSUE21_WHOLE_RUN_COMMANDS_PER_S,
            sense="min",
            target_text=f"≥ 3x ({3 * ISSUE21_WHOLE_RUN_COMMANDS_PER_S:.0f} /s)",
        ),
        figure(
            "create → ready p99, all at once",
            r["create_latency"]["p99_ms"],
            "ms",
            baseline=ISSUE21_CREATE_P99_MS,
            baseline_name=ISSUE21_SOURCE,
            target=8000.0,
        ),
        figure("create → ready p50, all at once", r["create_latency"]["p50_ms"], "ms"),
        figure(
            "delete all, client wall time",
            r["delete_wall_s"],
            "s",
            baseline=ISSUE21_DELETE_WALL_S,
            baseline_name=ISSUE21_SOURCE,
            target=3.0,
        ),
        figure(
            "memory per sandbox (PSS of the server's tree)"
            if pss is not None
            else "memory per sandbox (machine's used memory)",
            (pss if pss is not None else r["per_sandbox_memory_bytes"]) / mib,
            "MiB",
            target=2.0,
        ),
    ]
    start = r.get("orchestrator_start_rss_bytes")
    if start is not None and growth is not None:
        figures.append(
            figure(
                "orchestrator RSS: peak (baseline: at start)",
                r["orchestrator_peak_rss_bytes"] / mib,
                "MiB",
                baseline=start / mib,
                baseline_name="at start",
                target_text="flat in sandbox count",
            )
        )
        figures.append(
            figure(
                "orchestrator RSS growth per sandbox", growth / 1024, "KiB", target_text="~0 (flat)"
            )
        )
    figures.append(
        figure(
            "machine yardstick: bash -c true spawn p50 (before the run)",
            r["reference_spawn_p50_ms"],
            "ms",
            baseline=ISSUE21_SPAWN_P50_MS,
            baseline_name=ISSUE21_SOURCE,
            target_text="none: >1x means a slower machine than the baselines'",
        )
    )
    if r.get("leaks") is not None:
        figures.append(
            figure("things left after delete (all kinds)", r["leaks_total"], "", target=0.0)
        )
    return figures


def print_concurrency(results: dict[str, Any], out: Console | None = None) -> None:
    """The rich table of a ``bench_concurrency`` result."""
    out = out or Console()
    mib = 1 << 20
    table = Table(
        title=f"{results['sandboxes']} sandboxes x {results['commands_per_sandbox']} "
        f"commands on {results['backend']} ({results['image']}), "
        f"{results['commands_in_flight']} in flight"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        (
            "success rate",
            f"{results['success_rate'] * 100:.2f}% "
            f"({results['sandboxes_succeeded']}/{results['sandboxes']})",
        ),
        ("wall time (create + commands + delete)", f"{results['wall_s']:.1f} s"),
        (
            "phases create / commands / delete",
            " / ".join(
                f"{results['phases_s'].get(k, 0):.1f}"
                for k in ("create_s", "commands_s", "delete_s")
            )
            + " s",
        ),
        ("commands/s (command phase)", f"{results['commands_per_s']:.0f}"),
        ("commands/s (whole run)", f"{results['commands_per_s_end_to_end']:.0f}"),
        (
            "create → ready p50 / p99",
            f"{results['create_latency']['p50_ms']:.0f} / "
            f"{results['create_latency']['p99_ms']:.0f} ms",
        ),
        (
            "command round trip p50 / p99",
            f"{results['command_latency']['p50_ms']:.1f} / "
            f"{results['command_latency']['p99_ms']:.1f} ms",
        ),
        (
            "memory per sandbox (machine's used memory)",
            f"{results['per_sandbox_memory_bytes'] / mib:.2f} MiB",
        ),
    ]
    if results.get("per_sandbox_pss_bytes") is not None:
        rows.append(
            (
                "memory per sandbox (PSS of the server's process tree)",
                f"{results['per_sandbox_pss_bytes'] / mib:.2f} MiB",
            )
        )
    for name, rss in results["peak_rss_bytes"].items():
        rows.append((f"peak RSS of the {name}", f"{rss / mib:.0f} MiB"))
    rows += _rss_and_leak_rows(results)
    for name, value in rows:
        table.add_row(name, value)
    out.print(table)
    print_figures(results.get("figures", []), out)
    for error in results["errors"]:
        out.print(f"[red]error:[/red] {error}")


def _rss_and_leak_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    mib = 1 << 20
    rows = [
        ("commands/s (whole run: the three phases)", f"{results['commands_per_s_whole_run']:.0f}"),
        ("delete all, client wall time", f"{results['delete_wall_s'] or 0:.2f} s"),
    ]
    if results.get("orchestrator_start_rss_bytes") is not None:
        rows.append(
            (
                "orchestrator RSS at start / peak / growth per sandbox",
                f"{results['orchestrator_start_rss_bytes'] / mib:.0f} / "
                f"{results['orchestrator_peak_rss_bytes'] / mib:.0f} MiB / "
                f"{results['orchestrator_rss_growth_per_sandbox_bytes'] / 1024:.1f} KiB",
            )
        )
    rows.append(("sandboxes left after delete (API)", str(results["sandboxes_left_after_delete"])))
    found = results.get("leaks")
    if found:
        for when, label in (("at_delete", "as delete returned"), ("after", "after reaping")):
            counts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in found[when].items())
            rows.append((f"left behind {label}", counts))
        rows.append(("reaping settled in", f"{found['settle_s']:.1f} s"))
    return rows


def plot_concurrency(results: dict[str, Any], path: Path) -> None:
    """The machine's used memory over the run, and the latency percentiles, as PNG."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=110)
    series = results.get("_memory_series") or []
    base = results["memory_used_before_bytes"]
    left.plot([t for t, _ in series], [(u - base) / (1 << 20) for _, u in series])
    left.set_xlabel("s since start")
    left.set_ylabel("MiB used above start")
    left.set_title(f"{results['sandboxes']} sandboxes on {results['backend']}")
    qs = ("p50_ms", "p90_ms", "p99_ms")
    labels = [q.split("_")[0] for q in qs]
    x = range(len(qs))
    right.bar(
        [i - 0.2 for i in x],
        [results["create_latency"][q] for q in qs],
        0.4,
        label="create → ready",
    )
    right.bar(
        [i + 0.2 for i in x], [results["command_latency"][q] for q in qs], 0.4, label="command"
    )
    right.set_xticks(list(x), labels)
    right.set_yscale("log")
    right.set_ylabel("ms")
    right.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

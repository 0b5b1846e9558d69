"""Soak: a bounded mixed workload on an orchestrator of its own, then leak assertions.

A pool of workers loops until the time is up: create a sandbox, run execs (waited,
background, streamed, failing, timing out, cancelled), move files (small, ~1 MB, over the
upload cap, base64), list them, delete; every fifth sandbox is left for the server to reap
(by TTL or idle timeout). Every answer is checked, not just its status. Afterwards, while the
server still runs, ``GET /sandboxes`` is empty and the server's file descriptors and RSS
have not grown since the warm-up; after its graceful stop no sandbox, process, container,
pod, sandbox directory or temp file of the run remains.

``test_soak`` runs for ``ORCHARD_SOAK_SECONDS`` (default 30) in the normal suite;
``test_long_soak`` (marker ``soak``, excluded by default) for ``ORCHARD_LONG_SOAK_SECONDS``
(default 600): ``uv run pytest -m soak``. ``ORCHARD_SOAK_WORKERS`` overrides the per-backend
worker count. See docs/testing.md.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import psutil
import pytest

from orchard_env_client import AsyncSandbox, AsyncSandboxClient
from orchard_env_client.errors import PathNotFound, PayloadTooLarge, SandboxNotFound
from orchard_testing import RunningServer, leftovers

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SOAK_SECONDS = float(os.environ.get("ORCHARD_SOAK_SECONDS", "30"))
LONG_SOAK_SECONDS = float(os.environ.get("ORCHARD_LONG_SOAK_SECONDS", "600"))
KILL_GRACE_S = 5.0
# Kubernetes creates take ~2.5 s of a 2-core node each: keep its concurrency low.
WORKERS = {"local": 16, "docker": 6, "kubernetes": 3}
# (ttl_seconds, idle_timeout_seconds) of sandboxes left for the reaper. A TTL counts from
# the create call, so it must outlast a slow create plus one exec; the idle clock is only
# reset when a request starts, so it must outlast the slowest exec and heartbeat.
REAP_AFTER = {"local": (8.0, 5.0), "docker": (15.0, 5.0), "kubernetes": (40.0, 10.0)}
UPLOAD_CAP = 2 << 20  # --max-upload-bytes: the ~1 MB files fit, the over-cap ones do not
BIG = (1 << 20) + 123
FD_SLACK = 16
RSS_SLACK = 128 << 20  # loose: Python's allocator keeps what it once used
OP_TIMEOUT = 180.0  # any single operation slower than this is a hang
SETUP_MARGIN = 420.0  # server start, reaping, graceful stop, leak checks


def _workers(backend: str) -> int:
    return int(os.environ.get("ORCHARD_SOAK_WORKERS") or WORKERS[backend])


OPERATIONS = (
    "create",
    "delete",
    "exec_echo",
    "exec_stdin",
    "exec_fail",
    "exec_env_cwd",
    "exec_timeout",
    "background",
    "cancel",
    "exec_stream",
    "heartbeat",
    "list_sandboxes",
    "file_small",
    "file_big",
    "file_base64",
    "upload_over_cap",
    "stream_over_cap",
    "list_files",
    "leave_for_reaper",
)


class Skip(Exception):
    """An operation failed (its error is recorded); the rest of its sandbox's work goes on."""


@attrs.define
class Sample:
    """File descriptors and RSS of the orchestrator and (local) the shared agent."""

    at: float
    fds: int
    rss: int
    zombies: int = 0  # children of the orchestrator that ended and were never waited for
    zombie_names: list[str] = attrs.Factory(list)
    agent_fds: int | None = None
    agent_rss: int | None = None


@attrs.define
class Soak:
    server: RunningServer
    image: str
    client: AsyncSandboxClient
    duration: float
    workers: int
    big_local: Path  # an over-cap file the chunked upload streams from
    seed: int = attrs.Factory(lambda: random.SystemRandom().randrange(1 << 32))
    run: str = attrs.Factory(lambda: secrets.token_hex(4))
    ops: Counter[str] = attrs.Factory(Counter)
    latencies: dict[str, list[float]] = attrs.Factory(dict)
    errors: list[str] = attrs.Factory(list)
    inflight: Counter[str] = attrs.Factory(Counter)  # operations running now, by name
    created: set[str] = attrs.Factory(set)
    left_for_reaper: dict[str, float] = attrs.Factory(dict)  # id → latest expected reap
    seen: dict[int, tuple[float, str]] = attrs.Factory(dict)  # descendant pid → (start, cmd)
    sandbox_of: dict[int, str] = attrs.Factory(dict)  # holder (bwrap) pid → its sandbox
    samples: list[Sample] = attrs.Factory(list)
    started: float = 0.0
    end: float = 0.0
    elapsed: float = 0.0
    listed_at_end: list[str] = attrs.Factory(list)
    metrics: str = ""

    # -- bookkeeping ------------------------------------------------------------------
    async def op(self, name: str, work: Awaitable[Any]) -> Any:
        """Run one checked operation and count it, or record why it failed and raise Skip."""
        self.inflight[name] += 1
        started = time.monotonic()
        try:
            result = await asyncio.wait_for(work, OP_TIMEOUT)
        except TimeoutError:
            self.errors.append(f"{name}: HANG, no answer in {OP_TIMEOUT:g} s")
            raise Skip from None
        except (Exception, pytest.fail.Exception) as exc:  # pytest.raises fails with the latter
            self.errors.append(f"{name}: {type(exc).__name__}: {exc}"[:600])
            raise Skip from None
        finally:
            self.inflight[name] -= 1
        self.ops[name] += 1
        self.latencies.setdefault(name, []).append(time.monotonic() - started)
        return result

    async def quietly(self, name: str, work: Awaitable[Any]) -> Any:
        with contextlib.suppress(Skip):
            return await self.op(name, work)
        return None

    # -- the workload -----------------------------------------------------------------
    async def worker(self, w: int) -> None:
        rng = random.Random(self.seed + w)
        i = 0
        while time.monotonic() < self.end:
            i += 1
            if i % 5 == 2:
                await self.quietly("leave_for_reaper", self.leave_for_reaper(w, i))
                continue
            sbx = await self.quietly("create", self.create(w))
            if sbx is None:
                continue
            everything = i == 1 and w < 2  # so that every operation runs at least once
            try:
                await self.exercise(w, i, sbx, rng, everything)
            finally:
                await self.quietly("delete", self.delete(sbx))

    async def create(self, w: int) -> AsyncSandbox:
        sbx = await self.client.create_sandbox(
            self.image, labels={"soak": self.run, "worker": str(w)}, timeout=OP_TIMEOUT - 10
        )
        self.created.add(sbx.sandbox_id)
        assert sbx.info.status == "ready", sbx.info
        return sbx

    async def delete(self, sbx: AsyncSandbox) -> None:
        await sbx.delete()
        with pytest.raises(SandboxNotFound):
            await self.client.get_sandbox(sbx.sandbox_id)

    async def exercise(
        self, w: int, i: int, sbx: AsyncSandbox, rng: random.Random, everything: bool
    ) -> None:
        def want(p: float) -> bool:
            return everything or rng.random() < p

        tag = f"w{w}i{i}"
        commands: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("exec_echo", lambda: self.exec_echo(sbx))
        ]
        optional: list[tuple[float, str, Callable[[], Awaitable[None]]]] = [
            (0.5, "exec_stdin", lambda: self.exec_stdin(sbx, rng)),
            (0.5, "exec_fail", lambda: self.exec_fail(sbx)),
            (0.3, "exec_env_cwd", lambda: self.exec_env_cwd(sbx, tag)),
            (0.3, "exec_timeout", lambda: self.exec_timeout(sbx, w, i)),
            (0.5, "background", lambda: self.background(sbx)),
            (0.2, "cancel", lambda: self.cancel(sbx, w, i)),
            (0.4, "exec_stream", lambda: self.exec_stream(sbx)),
            (0.2, "heartbeat", lambda: self.heartbeat(sbx)),
            (0.2, "list_sandboxes", lambda: self.list_sandboxes(sbx, w)),
        ]
        commands += [(name, fn) for p, name, fn in optional if want(p)]
        # Commands of one sandbox run concurrently; files follow in order.
        await asyncio.gather(*(self.quietly(name, fn()) for name, fn in commands))
        folder = f"/workspace/{tag}"
        expected: dict[str, int] = {}
        if want(0.6):
            size = await self.quietly("file_small", self.file_small(sbx, folder, rng))
            if size is not None:
                expected["small.bin"] = size
        if want(0.3):
            size = await self.quietly("file_big", self.file_big(sbx, folder, rng))
            if size is not None:
                expected["big.bin"] = size
        if want(0.2):
            size = await self.quietly("file_base64", self.file_base64(sbx, folder, rng))
            if size is not None:
                expected["b64.bin"] = size
        if want(0.1):
            await self.quietly("upload_over_cap", self.upload_over_cap(sbx, folder))
        if want(0.1):
            await self.quietly("stream_over_cap", self.stream_over_cap(sbx, folder))
        if expected and want(0.5):
            await self.quietly("list_files", self.list_files(sbx, folder, expected))

    async def leave_for_reaper(self, w: int, i: int) -> None:
        ttl, idle = REAP_AFTER[self.server.backend]
        by_ttl = (i // 5) % 2 == 1
        sbx = await self.client.create_sandbox(
            self.image,
            labels={"soak": self.run, "worker": str(w), "reap": "ttl" if by_ttl else "idle"},
            ttl_seconds=ttl if by_ttl else None,
            idle_timeout_seconds=None if by_ttl else idle,
            timeout=OP_TIMEOUT - 10,
        )
        self.created.add(sbx.sandbox_id)
        self.left_for_reaper[sbx.sandbox_id] = time.monotonic() + ttl + idle + 30
        await self.exec_echo(sbx)
        if not by_ttl:
            assert (await sbx.heartbeat()).status == "ready"
        self.left_for_reaper[sbx.sandbox_id] = time.monotonic() + ttl + idle + 30

    # -- commands ---------------------------------------------------------------------
    async def exec_echo(self, sbx: AsyncSandbox) -> None:
        token = secrets.token_hex(8)
        job = await sbx.exec(f"echo {token}; echo err-{token} >&2", timeout=60)
        assert (job.status, job.exit_code, job.timed_out) == ("succeeded", 0, False), job
        assert (job.stdout, job.stderr) == (f"{token}\n", f"err-{token}\n"), job

    async def exec_stdin(self, sbx: AsyncSandbox, rng: random.Random) -> None:
        text = "".join(rng.choice("abc xyz\n") for _ in range(rng.randint(1, 3000)))
        job = await sbx.exec(["cat"], stdin=text, timeout=60)
        assert (job.status, job.exit_code, job.stdout) == ("succeeded", 0, text), job

    async def exec_fail(self, sbx: AsyncSandbox) -> None:
        job = await sbx.exec("echo out; echo bad >&2; exit 7", timeout=60)
        assert (job.status, job.exit_code, job.timed_out) == ("failed", 7, False), job
        assert (job.stdout, job.stderr) == ("out\n", "bad\n"), job

    async def exec_env_cwd(self, sbx: AsyncSandbox, tag: str) -> None:
        job = await sbx.exec('pwd; echo "$SOAK_TAG"', cwd="/tmp", env={"SOAK_TAG": tag})
        assert (job.exit_code, job.stdout) == (0, f"/tmp\n{tag}\n"), job

    async def exec_timeout(self, sbx: AsyncSandbox, w: int, i: int) -> None:
        marker = f"{600 + w}.{i:05d}"  # a unique sleep, to look for it afterwards
        started = time.monotonic()
        job = await sbx.exec(f"echo started; sleep {marker}", timeout=1)
        took = time.monotonic() - started
        assert (job.status, job.timed_out) == ("failed", True), job
        assert job.stdout == "started\n" and took < 30, (took, job)
        await self.no_process(sbx, f"sleep {marker}")

    async def no_process(self, sbx: AsyncSandbox, cmdline: str) -> None:
        """Nothing in the sandbox runs ``cmdline`` any more (its process group was killed).

        A SIGKILL to a group is delivered to each member on its own: a member may still be
        listed for a moment after the job ended, so it gets a few seconds to go.
        """
        script = (
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"
            f" | grep -c '^{cmdline} ' || true"
        )
        deadline = time.monotonic() + KILL_GRACE_S
        while True:
            job = await sbx.exec(script, timeout=60)
            if (job.exit_code, job.stdout) == (0, "0\n") or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert (job.exit_code, job.stdout) == (0, "0\n"), f"{cmdline!r} still runs: {job}"

    async def background(self, sbx: AsyncSandbox) -> None:
        tokens = [secrets.token_hex(6) for _ in range(2)]
        jobs = [
            await sbx.start(f"sleep 0.{n + 2}; echo {t}; echo e{t} >&2", timeout=60)
            for n, t in enumerate(tokens)
        ]
        await self.exec_echo(sbx)  # a waited exec while both run
        for job, token in zip(jobs, tokens, strict=True):
            done = await job.wait(timeout=90)
            assert (done.status, done.exit_code) == ("succeeded", 0), done
            assert (done.stdout, done.stderr) == (f"{token}\n", f"e{token}\n"), done
            assert done.job_id == job.job_id and done.sandbox_id == sbx.sandbox_id

    async def cancel(self, sbx: AsyncSandbox, w: int, i: int) -> None:
        marker = f"{700 + w}.{i:05d}"
        job = await sbx.start(f"sleep {marker}", timeout=120)
        deadline = time.monotonic() + 30
        while await job.status() == "queued" and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await job.cancel()
        done = await job.wait(timeout=60)
        assert done.status == "failed" and not done.succeeded, done
        await self.no_process(sbx, f"sleep {marker}")

    async def exec_stream(self, sbx: AsyncSandbox) -> None:
        events = [
            e
            async for e in sbx.exec_stream(
                "for i in 1 2 3; do echo line$i; sleep 0.05; done; echo err >&2", timeout=60
            )
        ]
        out = "".join(e.data or "" for e in events if e.type == "stdout")
        err = "".join(e.data or "" for e in events if e.type == "stderr")
        assert (out, err) == ("line1\nline2\nline3\n", "err\n"), events
        last = events[-1]
        assert last.type == "exit" and last.job is not None and last.job.exit_code == 0, last

    async def heartbeat(self, sbx: AsyncSandbox) -> None:
        info = await sbx.heartbeat()
        assert (info.sandbox_id, info.status) == (sbx.sandbox_id, "ready"), info

    async def list_sandboxes(self, sbx: AsyncSandbox, w: int) -> None:
        listed = await self.client.list_sandboxes(labels={"soak": self.run, "worker": str(w)})
        assert sbx.sandbox_id in {s.sandbox_id for s in listed}, listed
        assert all(s.labels["worker"] == str(w) for s in listed), listed

    # -- files ------------------------------------------------------------------------
    async def file_small(self, sbx: AsyncSandbox, folder: str, rng: random.Random) -> int:
        data = rng.randbytes(rng.randint(0, 4096))
        await sbx.upload_content(f"{folder}/small.bin", data)
        assert await sbx.download_content(f"{folder}/small.bin") == data
        return len(data)

    async def file_big(self, sbx: AsyncSandbox, folder: str, rng: random.Random) -> int:
        data = rng.randbytes(BIG)
        await sbx.upload_content(f"{folder}/big.bin", data)
        assert await sbx.download_content(f"{folder}/big.bin") == data
        job = await sbx.exec(f"sha256sum {folder}/big.bin", timeout=60)
        assert job.stdout.split()[0] == hashlib.sha256(data).hexdigest(), job
        return len(data)

    async def file_base64(self, sbx: AsyncSandbox, folder: str, rng: random.Random) -> int:
        """The JSON file API, which the client does not use (it streams raw bytes)."""
        data = rng.randbytes(rng.randint(1, 64 << 10))
        path = f"{folder}/b64.bin"
        async with httpx.AsyncClient(base_url=self.server.url, timeout=60) as http:
            body = {"path": path, "content": base64.b64encode(data).decode()}
            put = await http.post(f"/sandboxes/{sbx.sandbox_id}/files", json=body)
            assert put.status_code == 200 and put.json()["size"] == len(data), put.text
            got = await http.get(f"/sandboxes/{sbx.sandbox_id}/files", params={"path": path})
            assert got.status_code == 200, got.text
            assert base64.b64decode(got.json()["content"]) == data
        return len(data)

    async def upload_over_cap(self, sbx: AsyncSandbox, folder: str) -> None:
        """A body with a Content-Length over the cap: 413 and nothing written."""
        with pytest.raises(PayloadTooLarge):
            await sbx.upload_content(f"{folder}/huge.bin", b"x" * (UPLOAD_CAP + 1))
        with pytest.raises(PathNotFound):
            await sbx.download_content(f"{folder}/huge.bin")

    async def stream_over_cap(self, sbx: AsyncSandbox, folder: str) -> None:
        """A chunked body that grows over the cap: 413 and no partial or temp file."""
        await sbx.upload_content(f"{folder}/.keep", b"")  # the folder exists
        with pytest.raises(PayloadTooLarge):
            await sbx.upload_file(self.big_local, f"{folder}/streamed.bin")
        with pytest.raises(PathNotFound):
            await sbx.download_content(f"{folder}/streamed.bin")
        names = [f.name for f in await sbx.list_files(folder)]
        assert not [n for n in names if n.startswith(".orchard-upload")], names

    async def list_files(self, sbx: AsyncSandbox, folder: str, expected: dict[str, int]) -> None:
        files = {f.name: f for f in await sbx.list_files(folder)}
        for name, size in expected.items():
            assert files[name].type == "file" and files[name].size == size, files
        assert not [n for n in files if n.startswith(".orchard-upload")], files

    # -- watching the server ----------------------------------------------------------
    def sample(self) -> Sample:
        assert self.server.proc is not None
        me = psutil.Process(self.server.proc.pid)
        now = time.monotonic()
        with me.oneshot():
            sample = Sample(now, me.num_fds(), me.memory_info().rss)
            children = me.children(recursive=True)
        for child in children:
            with contextlib.suppress(psutil.Error):
                if child.status() == psutil.STATUS_ZOMBIE:
                    if child.ppid() == me.pid:
                        sample.zombies += 1
                        of = self.sandbox_of.get(child.pid, "sandbox unknown")
                        sample.zombie_names.append(f"{child.pid} {child.name()} ({of})")
                    continue
                argv = child.cmdline()
                self.seen.setdefault(child.pid, (child.create_time(), " ".join(argv)[:200]))
                if "--hostname" in argv[:-1]:
                    self.sandbox_of.setdefault(child.pid, argv[argv.index("--hostname") + 1])
        agent = agent_process(self.server)
        if agent is not None:
            with contextlib.suppress(psutil.Error), agent.oneshot():
                sample.agent_fds, sample.agent_rss = agent.num_fds(), agent.memory_info().rss
        self.samples.append(sample)
        return sample

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.sample)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


def agent_process(server: RunningServer) -> psutil.Process | None:
    """The local backend's shared agent (its pid is in ``<state>/agent.json``)."""
    if server.backend != "local":
        return None
    try:
        state = json.loads((server.state_dir / "agent.json").read_text())
        return psutil.Process(int(state["pid"]))
    except (OSError, ValueError, KeyError, psutil.Error):
        return None


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus metric's samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}(\{{(.*)\}})? (\S+)", line)
        if m and all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
            total += float(m.group(3))
    return total


def tree(root: Path) -> list[str]:
    """Every path under ``root``, relative to it."""
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def processes_of(markers: list[str], skip: set[int]) -> list[str]:
    """Processes (other than ``skip``) whose command line or environment names a marker."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid in skip:
            continue
        cmd = " ".join(proc.info["cmdline"] or [])
        env: dict[str, str] = {}
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
        blob = cmd + "\0" + "\0".join(f"{k}={v}" for k, v in env.items())
        if any(m in blob for m in markers):
            found.append(f"{proc.pid}: {cmd[:200]}")
    return found


@contextlib.contextmanager
def private_tmpdir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A TMPDIR of the run's own for the server and everything it starts. Short, because
    the Docker backend puts agent sockets under it (unix socket paths stop at 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="sk-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


async def soak(
    server: RunningServer, image: str, duration: float, tmp_path: Path, mp: pytest.MonkeyPatch
) -> None:
    system_tmp = Path(tempfile.gettempdir())
    tmp_before = set(os.listdir(system_tmp))
    procs_before = {p.pid for p in psutil.process_iter()}
    big_local = tmp_path / "over-cap.bin"
    big_local.write_bytes(os.urandom(UPLOAD_CAP + (1 << 20)))
    with private_tmpdir(mp) as private_tmp:
        marker = f"orchard-soak-{secrets.token_hex(6)}"
        mp.setenv("ORCHARD_SOAK_RUN", marker)  # inherited by the server and its agent
        server.start("--max-upload-bytes", str(UPLOAD_CAP))
        client = AsyncSandboxClient(server.url, auto_cleanup=False, timeout=120)
        state = Soak(server, image, client, duration, _workers(server.backend), big_local)
        try:
            await drive(state)
        finally:
            await client.close()
        problems = check_running(state)
        problems += check_after_stop(state, marker, private_tmp, procs_before)
        new_tmp = set(os.listdir(system_tmp)) - tmp_before
        ours = [n for n in new_tmp if marker in n or any(i in n for i in state.created)]
        if ours:
            problems.append(f"temp entries of the run left in {system_tmp}: {ours}")
    assert not problems, "\n".join(problems)


async def drive(state: Soak) -> None:
    """Run the workers for the duration, then wait for the reaper's share to go."""
    client = state.client
    state.sample()  # the baseline: started, no sandbox yet
    stop_watching = asyncio.Event()
    watcher = asyncio.create_task(state.watch(stop_watching))
    state.started = time.monotonic()
    state.end = state.started + state.duration
    try:
        pool = asyncio.gather(*(state.worker(w) for w in range(state.workers)))
        try:
            await asyncio.wait_for(pool, state.duration + 2 * OP_TIMEOUT)
        except TimeoutError:
            busy = +state.inflight
            state.errors.append(f"HANG: workers still busy after the run, in {dict(busy)}")
        state.elapsed = time.monotonic() - state.started
        deadline = max(state.left_for_reaper.values(), default=time.monotonic())
        while (listed := await client.list_sandboxes()) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        state.listed_at_end = [s.sandbox_id for s in listed]
        for sandbox_id in state.left_for_reaper:
            with contextlib.suppress(SandboxNotFound):
                await client.get_sandbox(sandbox_id)
                state.errors.append(f"reaper: {sandbox_id} still answers after its ttl/idle")
        state.metrics = httpx.get(f"{state.server.url}/metrics", timeout=30).text
        # The client's keep-alive connections are its own pool, sized by how many requests
        # it had in flight at once, not the server's: close them, so that the last sample
        # counts what the server holds by itself. (With slow creates, as on a busy
        # Kubernetes node, the warm-up ends before the client has opened its full pool.)
        await client.close()
        await asyncio.sleep(2)  # let closed connections settle
    finally:
        stop_watching.set()
        await watcher
    state.sample()


def check_running(state: Soak) -> list[str]:
    """Print the summary; what is wrong while the server still runs, after every delete."""
    base, end = state.samples[0], state.samples[-1]
    warmup = min(20.0, state.duration / 4)
    # The warm-up's peak: connection pools and caches have filled; later growth is a leak.
    window = [s for s in state.samples if s.at <= state.started + warmup] or [base]
    warm = Sample(
        window[-1].at,
        max(s.fds for s in window),
        max(s.rss for s in window),
        zombies=window[-1].zombies,
        agent_fds=max((s.agent_fds or 0 for s in window), default=0) or None,
        agent_rss=max((s.agent_rss or 0 for s in window), default=0) or None,
    )
    text = state.metrics
    total_ops = sum(state.ops.values())
    reaped = metric(text, "orchard_sandboxes_reaped_total")
    server_5xx = sum(
        metric(text, "orchard_http_requests_total", status=str(code)) for code in range(500, 600)
    )
    create, echo = state.latencies.get("create", []), state.latencies.get("exec_echo", [])
    summary = (
        f"SOAK backend={state.server.backend} seconds={state.elapsed:.0f} "
        f"workers={state.workers} seed={state.seed} sandboxes={len(state.created)} "
        f"reaped={reaped:.0f}/{len(state.left_for_reaper)} ops={total_ops} "
        f"ops/s={total_ops / state.elapsed:.1f} errors={len(state.errors)} "
        f"5xx={server_5xx:.0f} create_p50/p95={pct(create, 50):.2f}/{pct(create, 95):.2f}s "
        f"exec_p50/p95={pct(echo, 50):.3f}/{pct(echo, 95):.3f}s "
        f"fds base/warmup-peak/end={base.fds}/{warm.fds}/{end.fds} "
        f"rss_mb={base.rss >> 20}/{warm.rss >> 20}/{end.rss >> 20} "
        f"zombies={base.zombies}/{warm.zombies}/{end.zombies}"
    )
    if end.agent_fds is not None:
        summary += (
            f" agent_fds={base.agent_fds}/{warm.agent_fds}/{end.agent_fds}"
            f" agent_rss_mb={(base.agent_rss or 0) >> 20}/{(warm.agent_rss or 0) >> 20}"
            f"/{(end.agent_rss or 0) >> 20}"
        )
    print(f"\n{summary}\nops: {json.dumps(dict(sorted(state.ops.items())))}")

    problems = []
    if state.errors:
        problems.append(f"{len(state.errors)} unexpected errors, e.g.:")
        problems += [f"  {e}" for e in state.errors[:15]]
    missing = set(OPERATIONS) - set(state.ops)
    if missing:
        problems.append(f"operations that never ran: {sorted(missing)}")
    if state.listed_at_end:
        problems.append(f"GET /sandboxes after every delete and reap: {state.listed_at_end}")
    expected_metrics = {
        "orchard_http_requests_total 5xx": (server_5xx, 0),
        "orchard_inflight_operations": (metric(text, "orchard_inflight_operations"), 0),
        "orchard_sandboxes": (metric(text, "orchard_sandboxes"), 0),
        "orchard_sandbox_create_failures_total": (
            metric(text, "orchard_sandbox_create_failures_total"),
            0,
        ),
        "orchard_sandboxes_reaped_total": (reaped, len(state.left_for_reaper)),
    }
    for name, (got, want) in expected_metrics.items():
        if got != want:
            problems.append(f"metric {name} is {got:g}, expected {want}")
    if end.zombies:
        problems.append(
            f"{end.zombies} zombie children of the orchestrator after every delete "
            f"(never waited for), e.g. {end.zombie_names[:5]}"
        )
    grew = [
        ("orchestrator fds", warm.fds, end.fds, FD_SLACK),
        ("orchestrator RSS", warm.rss, end.rss, RSS_SLACK),
        ("agent fds", warm.agent_fds, end.agent_fds, FD_SLACK),
        ("agent RSS", warm.agent_rss, end.agent_rss, RSS_SLACK),
    ]
    for what, before, after, slack in grew:
        if before is not None and after is not None and after > before + slack:
            problems.append(f"{what} grew from {before} after the warm-up to {after}")
    return problems


def check_after_stop(
    state: Soak, marker: str, private_tmp: Path, procs_before: set[int]
) -> list[str]:
    """Stop the server gracefully; nothing of the run may remain."""
    server, problems = state.server, []
    proc = server.proc
    assert proc is not None
    stop_started = time.monotonic()
    server.stop()
    stop_took = time.monotonic() - stop_started
    # uvicorn re-raises the SIGTERM it handled once its shutdown is complete
    if proc.returncode not in (0, -signal.SIGTERM) or stop_took >= 30:
        problems.append(f"graceful stop ended {proc.returncode} after {stop_took:.1f} s")
    if "Application shutdown complete." not in server.log():
        problems.append("the server's log does not say its shutdown completed")
    if found := leftovers(server):
        problems.append(f"leftovers (processes, containers, pods or dirs): {found}")
    deadline = time.monotonic() + 10  # orphans take a moment to be killed and reaped
    while True:
        alive = still_running(state.seen)
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if alive:
        problems.append(f"processes of the orchestrator outlived it: {alive[:10]}")
    markers = [marker, str(server.state_dir), str(private_tmp), *state.created]
    if ours := processes_of(markers, skip={os.getpid(), *procs_before}):
        problems.append(f"processes of the run remain: {ours[:10]}")
    ids = state.created
    if in_state := [p for p in tree(server.state_dir) if set(Path(p).parts) & ids]:
        problems.append(f"sandbox files left in the state dir: {in_state[:10]}")
    # Only the Docker backend's per-orchestrator runtime dir may stay (empty).
    in_tmp = tree(private_tmp)
    if stray := [p for p in in_tmp if not Path(p).name.startswith("orch")]:
        problems.append(f"temp files of the server left: {stray[:10]}")
    warnings = 0
    for name, path in (("server", server.log_path), ("agent", server.state_dir / "agent.log")):
        text = path.read_text(errors="replace") if path and path.exists() else ""
        warnings += len(re.findall(r"\b(WARNING|ERROR)\b", text))
        if raised := tracebacks(text):
            problems.append(f"{len(raised)} tracebacks in the {name} log, e.g. {raised[0]}")
    print(
        f"graceful stop {stop_took:.1f} s; warnings/errors logged: {warnings}; "
        f"server temp dir after: {in_tmp}"
    )
    return problems


def tracebacks(log: str) -> list[str]:
    """The exception line ending each traceback in a log, with the frame that raised it."""
    found = []
    for block in log.split("Traceback (most recent call last):")[1:]:
        lines = block.splitlines()
        end = next((n for n, line in enumerate(lines) if line and not line[0].isspace()), 0)
        frames = [line.strip() for line in lines[:end] if line.strip().startswith("File ")]
        frames = frames or ["?"]
        ours = [f for f in frames if "orchard_env" in f] or frames
        found.append(f"{lines[end] if lines else ''} (in {ours[-1]}; last frame {frames[-1]})")
    return found


def still_running(seen: dict[int, tuple[float, str]]) -> list[str]:
    """Which of the processes seen during the run still run (zombies have ended)."""
    alive = []
    for pid, (created, cmd) in seen.items():
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid}: {cmd}")
    return alive


@pytest.mark.timeout(SOAK_SECONDS + SETUP_MARGIN)
async def test_soak(fresh_server, image, tmp_path, monkeypatch):
    await soak(fresh_server, image, SOAK_SECONDS, tmp_path, monkeypatch)


@pytest.mark.soak
@pytest.mark.timeout(LONG_SOAK_SECONDS + SETUP_MARGIN)
async def test_long_soak(fresh_server, image, tmp_path, monkeypatch, request):
    if "soak" not in (request.config.option.markexpr or ""):
        pytest.skip("the long soak runs only when asked for: pytest -m soak")
    await soak(fresh_server, image, LONG_SOAK_SECONDS, tmp_path, monkeypatch)

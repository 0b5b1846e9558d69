"""The embedded default backend: sandboxes on this machine, no daemon needed.

Each sandbox is a directory under the state dir (``workspace/``, ``tmp/``, ``record.json``)
and, when bubblewrap works, a holder process owning its mount/pid/ipc/uts/net namespaces.
One shared agent process serves all of them (see ``local_agent``), which keeps the
per-sandbox footprint to the holder alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..quantities import parse_cpu, parse_memory
from ..records import AgentEndpoint, SandboxRecord, load_record, save_record
from ..settings import Settings
from .base import RESTART_LOSS, BackendError, SandboxRegistry
from .bubblewrap import Holder, HolderSpec, bwrap_usable, start_holder
from .cgroups import Cgroups, Limits
from .local_agent import LocalAgent
from .processes import is_alive, kill_and_wait, start_time

log = logging.getLogger("orchard_env_server")

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Host paths the file API must never reach through the read-only root mount.
_HIDDEN = ("/proc", "/sys", "/dev")


class LocalBackend:
    """Sandboxes as bubblewrap namespaces (or plain directories) on the local machine."""

    name = "local"
    sandboxes_outlive_orchestrator = False

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._state = settings.state_dir.resolve()
        self._sandboxes = self._state / "sandboxes"
        self._images = self._state / "images"
        self._empty = self._state / "empty"
        self.isolated, self._why_not = False, ""
        self._agent = LocalAgent(self._state, settings.max_output_bytes, settings.max_upload_bytes)
        self._registered: set[str] = set()
        self._cgroups = Cgroups(self._state)
        self._agent_restart = asyncio.Lock()
        # Holder starts block on bwrap's setup (~10 ms each); the default pool of a few
        # threads would queue a burst of creates behind each other.
        self._spawner = ThreadPoolExecutor(max_workers=32, thread_name_prefix="orchard-holder")

    def attach(self, registry: SandboxRegistry) -> None:
        """Every sandbox here is one this process made or found on start: nothing to tell."""

    # -- start / stop ---------------------------------------------------------------
    async def start(self) -> list[SandboxRecord]:
        for d in (self._sandboxes, self._images, self._empty):
            d.mkdir(parents=True, exist_ok=True)
        self._state.chmod(0o700)
        if self._settings.local_memory_default:
            try:
                parse_memory(self._settings.local_memory_default)
            except ValueError as exc:
                raise BackendError(f"--local-memory-default: {exc}") from None
        mode = self._settings.isolation
        if mode == "none":
            self.isolated, self._why_not = False, "isolation turned off (--isolation none)"
        else:
            self.isolated, self._why_not = await asyncio.to_thread(bwrap_usable)
            if mode == "bubblewrap" and not self.isolated:
                raise BackendError(f"--isolation bubblewrap: {self._why_not}")
        if not self.isolated:
            log.warning(
                "local backend runs UNISOLATED: %s. Commands share the host's filesystem, "
                "processes and network. Install bubblewrap for isolation.",
                self._why_not,
            )
        else:
            usable, why = await asyncio.to_thread(self._cgroups.probe)
            if not usable:
                log.warning("local sandboxes run WITHOUT resource limits (pids, memory, "
                            "cpu): %s. Run as root for per-sandbox cgroups.", why)  # fmt: skip
        fresh_agent = await self._agent.ensure()
        known = set() if fresh_agent else await self._agent.registered_ids()
        found = await self._recover(known)
        if self._cgroups.usable:
            alive = {r.sandbox_id for r in found if r.status != "failed"}
            for sandbox_id in self._cgroups.leftovers(alive):
                await asyncio.to_thread(self._cgroups.remove, sandbox_id)
        return found

    async def _recover(self, known: set[str]) -> list[SandboxRecord]:
        """Sandboxes of an earlier run whose holder lives on; the rest are removed and come
        back ``failed``, so that their clients learn what happened."""
        found: list[SandboxRecord] = []
        for path in sorted(self._sandboxes.iterdir()):
            record = load_record(path)
            if record is None or not self._holder_alive(record):
                log.info("cleaning up sandbox %s left by an earlier run", path.name)
                await self._kill_holder(record)
                await asyncio.to_thread(shutil.rmtree, path, True)
                if record is not None:
                    record.mark("failed", f"{RESTART_LOSS} (its namespace holder had exited)")
                    found.append(record)
                continue
            if record.agent is not None:
                record.agent.base_url = self._agent.base_url
            if record.sandbox_id in known:
                self._registered.add(record.sandbox_id)
            else:
                await self._register(record)
            found.append(record)
        return found

    async def close(self, *, delete_sandboxes: bool) -> None:
        if delete_sandboxes:
            for path in list(self._sandboxes.iterdir()):
                record = load_record(path)
                if record is None:
                    await asyncio.to_thread(shutil.rmtree, path, True)
                else:
                    await self.delete(record)
            await self._agent.stop()
            if self._cgroups.usable:
                await asyncio.to_thread(self._cgroups.close)
        await self._agent.aclose()
        self._spawner.shutdown(wait=False)

    # -- create / ready / delete ----------------------------------------------------
    async def create(self, record: SandboxRecord) -> None:
        home = self._sandboxes / record.sandbox_id
        workspace, tmp = home / "workspace", home / "tmp"
        try:
            root = await self._root_for(record.image)
            for d in (workspace, tmp):
                d.mkdir(parents=True)
            tmp.chmod(0o1777)
        except OSError as exc:
            raise BackendError(f"cannot prepare sandbox directory: {exc}") from exc
        state: dict[str, Any] = {"root": str(root), "isolated": self.isolated}
        if self.isolated:
            spec = HolderSpec(
                sandbox_id=record.sandbox_id,
                root=root,
                workspace=workspace,
                tmp=tmp,
                block_network=record.block_network,
                masks=[str(self._state)] if root == Path("/") else [],
            )
            holder = await self._start_holder(spec)
            state.update(
                holder_pid=holder.pid,
                holder_start=start_time(holder.pid),
                monitor_pid=holder.monitor_pid,
                monitor_start=start_time(holder.monitor_pid),
            )
            record.backend_state = state  # so that a failure below kills this holder
            if self._cgroups.usable:
                state["cgroup_procs"] = await self._limit(record, holder.pid)
        record.backend_state = state
        record.agent = AgentEndpoint(
            base_url=self._agent.base_url,
            token=secrets.token_urlsafe(24),
            sandbox_header=record.sandbox_id,
        )
        save_record(self._sandboxes / record.sandbox_id, record)
        await self._register(record)

    async def _start_holder(self, spec: HolderSpec) -> Holder:
        """Start a holder off the loop. A create cancelled meanwhile (a client gone, a
        shutdown) still gets its holder, which nothing records yet: kill it then."""
        started = asyncio.get_running_loop().run_in_executor(self._spawner, start_holder, spec)
        try:
            return await asyncio.shield(started)
        except (OSError, RuntimeError) as exc:
            raise BackendError(str(exc)) from exc
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                holder = await started
                await asyncio.to_thread(kill_and_wait, holder.pid, None)
                await asyncio.to_thread(kill_and_wait, holder.monitor_pid, None)
            raise

    async def _limit(self, record: SandboxRecord, holder_pid: int) -> list[str]:
        """The sandbox's cgroups, its holder moved in; commands join them as they start."""
        memory = record.memory or self._settings.local_memory_default

        def make() -> list[str]:
            limits = Limits(
                pids=self._settings.pids_limit,
                memory_bytes=parse_memory(memory) if memory else None,
                cpus=parse_cpu(record.cpu) if record.cpu else None,
            )
            procs = self._cgroups.create(record.sandbox_id, limits)
            self._cgroups.attach(procs, holder_pid)
            return procs

        try:
            return await asyncio.to_thread(make)
        except (OSError, ValueError) as exc:
            await self._kill_holder(record)
            raise BackendError(f"cannot limit the sandbox's resources: {exc}") from exc

    async def wait_ready(self, record: SandboxRecord) -> None:
        return None  # registration with the agent is readiness

    async def delete(self, record: SandboxRecord) -> None:
        if record.sandbox_id in self._registered:
            self._registered.discard(record.sandbox_id)
            try:
                await self._agent.admin("DELETE", f"/_admin/sandboxes/{record.sandbox_id}")
            except BackendError as exc:
                log.warning("agent did not forget %s: %s", record.sandbox_id, exc)
        await self._kill_holder(record)
        if record.backend_state.get("cgroup_procs"):
            await asyncio.to_thread(self._cgroups.remove, record.sandbox_id)
        await asyncio.to_thread(shutil.rmtree, self._sandboxes / record.sandbox_id, True)

    async def check(self, record: SandboxRecord) -> str | None:
        if not self._agent.alive():
            # Many checks run at once when the agent dies under load: one restarts it.
            async with self._agent_restart:
                if not self._agent.alive():
                    log.warning("local agent died; starting a new one, re-registering sandboxes")
                    self._registered.clear()
                    await self._agent.ensure()
        if not self._holder_alive(record):
            return "the sandbox's namespace holder process exited"
        if record.sandbox_id not in self._registered:
            if record.agent is not None:
                record.agent.base_url = self._agent.base_url
            await self._register(record)
        return None

    # -- facts ----------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        if self.isolated:
            warnings = [] if self._cgroups.usable else [
                f"local sandboxes have no resource limits: {self._cgroups.why_not}"
            ]  # fmt: skip
            if self._agent.stale:
                warnings.append(self._agent.stale)
            return {"isolation": "bubblewrap", "warnings": warnings}
        return {
            "isolation": "none",
            "warnings": [f"local sandboxes are not isolated: {self._why_not}"],
        }

    async def resources(self) -> dict[str, Any]:
        usage = shutil.disk_usage(self._state)
        return {
            "backend": self.name,
            "isolation": "bubblewrap" if self.isolated else "none",
            "sandboxes_running": len(self._registered),
            "cpu_count": os.cpu_count(),
            "memory_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "memory_available_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"),
            "disk_free_bytes": usage.free,
        }

    # -- helpers --------------------------------------------------------------------
    def _holder_alive(self, record: SandboxRecord) -> bool:
        state = record.backend_state
        if not state.get("isolated"):
            return True
        return is_alive(state.get("holder_pid"), state.get("holder_start"))

    async def _kill_holder(self, record: SandboxRecord | None) -> None:
        if record is None or not record.backend_state.get("isolated"):
            return
        state = record.backend_state
        # Killing the namespace's pid 1 takes every process of the sandbox with it.
        await asyncio.to_thread(kill_and_wait, state["holder_pid"], state.get("holder_start"))
        await asyncio.to_thread(kill_and_wait, state["monitor_pid"], state.get("monitor_start"))

    def _context(self, record: SandboxRecord) -> dict[str, Any]:
        home = self._sandboxes / record.sandbox_id
        root = Path(record.backend_state["root"])
        if record.backend_state.get("isolated"):
            workspace, tmp_path = "/workspace", "/tmp"
            mounts = [
                {"path": "/", "host_path": str(root), "writable": False},
                {"path": "/workspace", "host_path": str(home / "workspace"), "writable": True},
                {"path": "/tmp", "host_path": str(home / "tmp"), "writable": True},
            ]
            if root == Path("/"):
                hidden = [*_HIDDEN, str(self._state)]
                mounts += [
                    {"path": h, "host_path": str(self._empty), "writable": False} for h in hidden
                ]
            holder: int | None = record.backend_state["holder_pid"]
        else:
            workspace, tmp_path = str(home / "workspace"), str(home / "tmp")
            mounts = [
                {"path": "/workspace", "host_path": workspace, "writable": True},
                {"path": "/tmp", "host_path": tmp_path, "writable": True},
                {"path": workspace, "host_path": workspace, "writable": True},
            ]
            holder = None
        env = {
            "PATH": _PATH,
            "HOME": workspace,
            "LANG": "C.UTF-8",
            "TERM": "xterm-256color",
            "TMPDIR": tmp_path,
            "HOSTNAME": record.sandbox_id,
            **record.env,
        }
        workdir = record.workdir or workspace
        return {
            "sandbox_id": record.sandbox_id,
            "token": record.agent.token if record.agent else "",
            "env": env,
            "workdir": workdir,
            "holder_pid": holder,
            "mounts": mounts,
            "cgroup_procs": record.backend_state.get("cgroup_procs", []),
        }

    async def _register(self, record: SandboxRecord) -> None:
        await self._agent.admin("POST", "/_admin/sandboxes", self._context(record))
        self._registered.add(record.sandbox_id)

    async def _root_for(self, image: str) -> Path:
        """``host`` is the machine's own root; otherwise a rootfs directory or archive."""
        if image == "host":
            return Path("/")
        path = Path(image)
        if not path.is_absolute() or not path.exists():
            raise BackendError(
                f"local backend: image {image!r} is neither 'host' nor an absolute path to "
                "a root filesystem directory or a .tar/.tar.gz archive"
            )
        if path.is_dir():
            return path
        return await asyncio.to_thread(self._unpack_image, path)

    def _unpack_image(self, archive: Path) -> Path:
        st = archive.stat()
        key = hashlib.sha256(f"{archive}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
        target = self._images / key
        if target.is_dir():
            return target
        partial = self._images / f".{key}.{secrets.token_hex(4)}"
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(partial, filter="tar")
        except (OSError, tarfile.TarError) as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise BackendError(f"cannot unpack image archive {archive}: {exc}") from exc
        try:
            partial.rename(target)
        except OSError:
            shutil.rmtree(partial, ignore_errors=True)  # another create won the race
        return target

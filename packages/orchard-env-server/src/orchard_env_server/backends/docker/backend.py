"""The Docker backend: one container per sandbox, the agent injected into any image.

Per sandbox the orchestrator keeps ``<state>/docker/<id>/record.json`` and a run directory
(``<runtime>/<id>/``, bind-mounted at ``/.orchard/run``) holding the agent's unix socket
and token file. The socket, not a published port or the bridge IP, is how the agent is
reached: it works with ``--network none`` and needs no userland proxy.

Readiness is the agent's health. An event stream from the engine (``die``, ``oom``,
``destroy``) marks sandboxes whose container stopped or vanished; a full listing after
every reconnect catches what happened while the stream was down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from ...records import AgentEndpoint, SandboxRecord, load_record, save_record
from ...settings import Settings
from ...unix_sockets import PinnedUnixConnector
from ..base import (
    RESTART_LOSS,
    BackendError,
    BackendInfo,
    BackendUnavailable,
    Resources,
    SandboxRegistry,
)
from ..hardening import engine_seccomp_warning
from .api import DockerEngine, EngineError
from .injection import AgentMount, prepare_agent_mount
from .spec import (
    AGENT_SOCKET,
    AGENT_TOKEN_FILE,
    LABEL_ORCHESTRATOR,
    LABEL_SANDBOX,
    container_name,
    container_spec,
)

log = logging.getLogger("orchard_env_server")

_SOCKET_PATH_MAX = 107  # sun_path, less the terminating NUL
_INSPECT_EVERY_S = 3.0


class DockerBackend:
    """Sandboxes as containers on a Docker engine."""

    name = "docker"
    sandboxes_outlive_orchestrator = False
    supports_warm_pools = False
    reserved_ports: frozenset[int] = frozenset()

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._engine = DockerEngine(settings.docker.host)
        self._state = settings.state_dir.resolve() / "docker"
        self._orchestrator = ""
        self._runtime = Path()
        self._agent: AgentMount | None = None
        self._containers: dict[str, str] = {}  # container id → sandbox id, ours and alive
        self._dead: dict[str, str] = {}  # container id → why it stopped
        self._watcher: asyncio.Task[None] | None = None
        self._engine_error: str | None = None
        self._seccomp_warning: str | None = None

    def attach(self, registry: SandboxRegistry) -> None:
        """Every sandbox here is one this process made or found on start: nothing to tell."""

    # -- start / stop ---------------------------------------------------------------
    async def start(self) -> list[SandboxRecord]:
        self._state.mkdir(parents=True, exist_ok=True)
        self._state.parent.chmod(0o700)
        self._orchestrator = self._orchestrator_id()
        self._runtime = _runtime_dir(self._orchestrator)
        try:
            version = await self._engine.version()
        except EngineError as exc:
            raise BackendError(
                f"no Docker engine answers at {self._engine.address} ({exc}); start dockerd "
                "or point DOCKER_HOST at one"
            ) from exc
        log.info("docker engine %s at %s", version.get("Version"), self._engine.address)
        await self._check_engine_security()
        self._agent = await prepare_agent_mount(
            self._engine, self._settings.agent_image, self._settings.docker.agent_bundle
        )
        found = await self._recover()
        self._watcher = asyncio.create_task(self._watch_forever(), name="orchard-docker-events")
        return found

    async def _check_engine_security(self) -> None:
        try:
            info = await self._engine.info()
        except EngineError as exc:
            raise BackendError(f"cannot read the Docker engine's info: {exc}") from exc
        self._seccomp_warning = engine_seccomp_warning(info.get("SecurityOptions"))
        if self._seccomp_warning:
            log.warning("%s: sandboxes are not filtered by seccomp", self._seccomp_warning)

    def _orchestrator_id(self) -> str:
        """Stable across restarts on one state dir: whose containers these are."""
        path = self._state / "orchestrator-id"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            value = "orch-" + secrets.token_hex(8)
            path.write_text(value)
            return value

    async def _recover(self) -> list[SandboxRecord]:
        """Adopt running containers that have a record; remove everything else of ours.

        Sandboxes with a record whose container is not running come back ``failed`` (the
        service keeps them for a while so that clients learn what happened)."""
        containers = await self._list_ours()
        by_sandbox = {c["Labels"].get(LABEL_SANDBOX, ""): c for c in containers}
        found: list[SandboxRecord] = []
        for home in sorted(p for p in self._state.iterdir() if p.is_dir()):
            record = load_record(home)
            container = by_sandbox.pop(home.name, None)
            running = container is not None and container.get("State") == "running"
            if record is not None and running and record.agent is not None:
                assert container is not None
                self._containers[container["Id"]] = record.sandbox_id
                found.append(record)
                continue
            log.info("cleaning up sandbox %s left by an earlier run", home.name)
            if container is not None:
                await self._engine.remove(container["Id"])
            self._remove_dirs(home.name)
            if record is not None:
                state = container.get("State") if container is not None else "gone"
                record.mark("failed", f"{RESTART_LOSS} (its container: {state})")
                found.append(record)
        for container in by_sandbox.values():
            log.info("removing container %s: no record of it", container["Id"][:12])
            await self._engine.remove(container["Id"])
        return found

    async def close(self, *, delete_sandboxes: bool) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if delete_sandboxes:
            records = [
                r for r in (load_record(p) for p in self._state.iterdir() if p.is_dir()) if r
            ]
            await asyncio.gather(*(self.delete(r) for r in records), return_exceptions=True)
        await self._engine.aclose()

    # -- create / ready / delete ----------------------------------------------------
    async def create(self, record: SandboxRecord) -> None:
        assert self._agent is not None, "start() first"
        sandbox_id = record.sandbox_id
        run_dir = self._runtime / sandbox_id
        socket_path = run_dir / AGENT_SOCKET.rsplit("/", 1)[1]
        token = secrets.token_urlsafe(24)
        try:
            (self._state / sandbox_id).mkdir()
            run_dir.mkdir(parents=True)
            run_dir.chmod(0o777)  # the image's USER, whoever it is, creates the socket here
            token_file = run_dir / AGENT_TOKEN_FILE.rsplit("/", 1)[1]
            token_file.write_text(token)
            token_file.chmod(0o644)
        except OSError as exc:
            raise BackendError(f"cannot prepare the sandbox's run directory: {exc}") from exc
        spec = container_spec(record, self._settings, self._orchestrator, self._agent, str(run_dir))
        try:
            container = await self._engine.create_container(container_name(sandbox_id), spec)
        except EngineError as exc:
            self._remove_dirs(sandbox_id)
            if exc.status is None:
                raise BackendUnavailable(str(exc)) from exc
            if exc.not_found:
                raise BackendError(
                    f"image {record.image!r} is not on the Docker engine (nothing is pulled "
                    "here: build or load it first)"
                ) from exc
            raise BackendError(f"cannot create a container from {record.image!r}: {exc}") from exc
        record.backend_state = {"container_id": container, "run_dir": str(run_dir)}
        record.agent = AgentEndpoint(base_url="http://sandbox", token=token, uds=str(socket_path))
        self._containers[container] = sandbox_id
        save_record(self._state / sandbox_id, record)
        try:
            await self._engine.start(container)
        except EngineError as exc:
            raise BackendError(f"the container did not start: {exc}") from exc

    async def wait_ready(self, record: SandboxRecord) -> None:
        container = record.backend_state["container_id"]
        assert record.agent is not None and record.agent.uds
        connector = PinnedUnixConnector(path=record.agent.uds)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=2.0)
        ) as http:
            # The event stream reports a container that dies; inspecting is the fallback
            # for when the stream is down, so it can be rare.
            delay, next_inspect = 0.005, asyncio.get_running_loop().time() + _INSPECT_EVERY_S
            while True:
                if container in self._dead:
                    raise BackendError(self._dead[container])
                if os.path.exists(record.agent.uds):
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                        async with http.get("http://sandbox/health") as health:
                            if health.status == 200:
                                return
                if asyncio.get_running_loop().time() >= next_inspect:
                    why = await self._why_stopped(container)
                    if why:
                        raise BackendError(why)
                    next_inspect += _INSPECT_EVERY_S
                await asyncio.sleep(delay)
                delay = min(delay * 1.5, 0.05)

    async def delete(self, record: SandboxRecord) -> None:
        container = record.backend_state.get("container_id")
        if container:
            self._containers.pop(container, None)
            self._dead.pop(container, None)
            try:
                await self._engine.remove(container)
            except EngineError as exc:
                # The record stays on disk, so the next start removes the container.
                log.warning("could not remove container %s: %s", container[:12], exc)
                return
        self._remove_dirs(record.sandbox_id)

    async def retire(self, record: SandboxRecord) -> None:
        await self.delete(record)  # one engine call: nothing worth deferring

    async def reap(self, record: SandboxRecord) -> None:
        return None

    async def claim(self, record: SandboxRecord) -> None:
        raise BackendError(f"warm pools are not supported on the {self.name} backend")

    async def check(self, record: SandboxRecord) -> str | None:
        return self._dead.get(record.backend_state.get("container_id", ""))

    # -- facts ----------------------------------------------------------------------
    def info(self) -> BackendInfo:
        warnings = [w for w in (self._engine_error, self._seccomp_warning) if w]
        return BackendInfo("docker", warnings=warnings)

    async def resources(self) -> Resources:
        try:
            info = await self._engine.info()
        except EngineError as exc:
            raise BackendUnavailable(str(exc)) from exc
        return Resources(
            backend=self.name,
            isolation="docker",
            sandboxes_running=len(self._containers),
            cpu_count=info.get("NCPU"),
            memory_total_bytes=info.get("MemTotal"),
            details={
                "engine": self._engine.address,
                "engine_version": info.get("ServerVersion"),
                "containers_running": info.get("ContainersRunning"),
            },
        )

    # -- watching the engine --------------------------------------------------------
    async def _list_ours(self) -> list[dict[str, Any]]:
        try:
            return await self._engine.containers([f"{LABEL_ORCHESTRATOR}={self._orchestrator}"])
        except EngineError as exc:
            raise BackendError(str(exc)) from exc

    async def _watch_forever(self) -> None:
        backoff = 0.5
        labels = [f"{LABEL_ORCHESTRATOR}={self._orchestrator}"]
        while True:
            try:
                # Events from before the listing are replayed, so nothing falls between.
                events = self._engine.events(labels, since=time.time())
                await self._reconcile()
                self._engine_error = None
                async for event in events:
                    backoff = 0.5
                    await self._on_event(event)
                raise EngineError(None, "the engine closed its event stream")
            except (EngineError, BackendError) as exc:
                self._engine_error = f"Docker engine trouble, retrying: {exc}"
                log.warning("%s", self._engine_error)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)

    async def _on_event(self, event: dict[str, Any]) -> None:
        action = str(event.get("Action") or event.get("status") or "")
        container = str(event.get("id") or event.get("Actor", {}).get("ID") or "")
        if container not in self._containers or container in self._dead:
            return
        if action == "destroy":
            self._dead[container] = "the sandbox's container was removed behind the orchestrator"
        elif action == "die":
            self._dead[container] = await self._why_stopped(container) or "the container died"

    async def _reconcile(self) -> None:
        """After (re)connecting: mark ours that stopped or vanished while nobody watched."""
        running = {c["Id"] for c in await self._list_ours() if c.get("State") == "running"}
        for container in list(self._containers):
            if container not in running and container not in self._dead:
                self._dead[container] = (
                    await self._why_stopped(container) or "the sandbox's container is gone"
                )

    async def _why_stopped(self, container: str) -> str | None:
        """None while the container runs; else what ended it, with its last output."""
        try:
            state = (await self._engine.inspect(container))["State"]
        except EngineError as exc:
            if exc.not_found:
                return "the sandbox's container was removed behind the orchestrator"
            return None  # engine trouble is not the sandbox's death
        if state.get("Running"):
            return None
        code = state.get("ExitCode")
        why = f"the sandbox's container exited with code {code}"
        if state.get("OOMKilled"):
            why += " (killed by the kernel OOM killer: memory limit reached)"
        elif code == 137:
            why += " (SIGKILL)"
        if state.get("Error"):
            why += f": {state['Error']}"
        tail = (await self._engine.logs_tail(container, 5)).strip()
        return f"{why}; last output: {tail[-400:]}" if tail else why

    # -- helpers --------------------------------------------------------------------
    def _remove_dirs(self, sandbox_id: str) -> None:
        shutil.rmtree(self._state / sandbox_id, ignore_errors=True)
        shutil.rmtree(self._runtime / sandbox_id, ignore_errors=True)


def _runtime_dir(orchestrator_id: str) -> Path:
    """A short path for agent sockets: unix socket paths are limited to 107 bytes."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    root = base / f"orchard-env-{os.getuid()}" / orchestrator_id
    root.mkdir(parents=True, exist_ok=True)
    # Only the orchestrator's user gets to the sockets and tokens; a container sees just
    # its own run directory, bind-mounted.
    root.parent.chmod(0o700)
    longest = root / ("x" * 40) / AGENT_SOCKET.rsplit("/", 1)[1]
    if len(str(longest)) > _SOCKET_PATH_MAX:
        raise BackendError(f"runtime dir {root} is too long for unix socket paths")
    return root

"""How the agent bundle reaches a Docker sandbox: the way an init container would bring it.

By default the injector image (``infra/agent/Dockerfile``) copies the bundle once into a
named volume, ``orchard-agent-<image id>``, the Docker counterpart of the emptyDir an init
container fills on Kubernetes; every sandbox mounts that volume read-only. Alternatively a
bundle directory on the engine's host is bind-mounted read-only (``--agent-bundle``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import attrs

from ..base import BackendError
from ..hardening import docker_confinement
from ..injection import AGENT_MOUNT, agent_entry, label
from .api import DockerEngine, EngineError

log = logging.getLogger("orchard_env_server")

COMPLETE_MARKER = ".complete"
_VOLUME_LABEL = label("agent-image")
_INJECTOR_ROOT = "/orchard-agent"  # where the injector image holds the bundle
_BUSYBOX = f"{_INJECTOR_ROOT}/bin/busybox"


@attrs.frozen
class AgentMount:
    """The mount that puts the bundle at ``AGENT_MOUNT`` in a container."""

    kind: str  # "volume" | "bind"
    source: str

    def spec(self) -> dict[str, Any]:
        mount: dict[str, Any] = {
            "Type": self.kind,
            "Source": self.source,
            "Target": AGENT_MOUNT,
            "ReadOnly": True,
        }
        if self.kind == "volume":
            mount["VolumeOptions"] = {"NoCopy": True}
        return mount


async def prepare_agent_mount(
    engine: DockerEngine, agent_image: str, agent_bundle: Path | None
) -> AgentMount:
    """Check or build what every sandbox will mount; BackendError says how to fix a miss."""
    if agent_bundle is not None:
        return _bind_mount(agent_bundle)
    try:
        image = await engine.image(agent_image)
    except EngineError as exc:
        if exc.not_found:
            raise BackendError(
                f"the agent injector image {agent_image!r} is not on the engine: build it with "
                "`infra/images/build --only injector`, or give --agent-bundle DIR"
            ) from exc
        raise BackendError(str(exc)) from exc
    volume = "orchard-agent-" + str(image["Id"]).removeprefix("sha256:")[:16]
    try:
        await engine.volume(volume)
        exists = True
    except EngineError as exc:
        if not exc.not_found:
            raise BackendError(str(exc)) from exc
        exists = False
    if exists and await _run_injector(engine, agent_image, volume, _check_command()) == 0:
        return AgentMount("volume", volume)
    if exists:
        log.warning("agent volume %s is incomplete; filling it again", volume)
        await engine.remove_volume(volume)
    await engine.create_volume(volume, {_VOLUME_LABEL: agent_image})
    code = await _run_injector(engine, agent_image, volume, _copy_command())
    if code != 0:
        await engine.remove_volume(volume)
        raise BackendError(f"the agent injector {agent_image!r} exited with code {code}")
    log.info("agent bundle copied into volume %s from %s", volume, agent_image)
    await _remove_stale_volumes(engine, keep=volume)
    return AgentMount("volume", volume)


async def _remove_stale_volumes(engine: DockerEngine, keep: str) -> None:
    """Bundles of older injector images; the engine refuses (409) while a sandbox uses one."""
    try:
        volumes = await engine.volumes(_VOLUME_LABEL)
    except EngineError:
        return
    for volume in volumes:
        if volume["Name"] != keep:
            try:
                await engine.remove_volume(volume["Name"])
            except EngineError as exc:
                log.info("keeping agent volume %s: %s", volume["Name"], exc)


def _bind_mount(bundle: Path) -> AgentMount:
    bundle = bundle.resolve()
    manifest = bundle / "bundle.json"
    try:
        entry = json.loads(manifest.read_text())["entry"]
    except (OSError, ValueError, KeyError) as exc:
        raise BackendError(f"--agent-bundle {bundle}: no readable bundle.json ({exc})") from exc
    expected = [part.removeprefix(AGENT_MOUNT + "/") for part in agent_entry()]
    if entry != expected:
        raise BackendError(f"--agent-bundle {bundle}: entry {entry} differs from {expected}")
    return AgentMount("bind", str(bundle))


def _copy_command() -> list[str]:
    script = f"{_BUSYBOX} cp -a {_INJECTOR_ROOT}/. /target/ && {_BUSYBOX} touch /target/{COMPLETE_MARKER}"
    return [_BUSYBOX, "sh", "-c", script]


def _check_command() -> list[str]:
    return [_BUSYBOX, "test", "-f", f"/target/{COMPLETE_MARKER}"]


async def _run_injector(engine: DockerEngine, image: str, volume: str, argv: list[str]) -> int:
    """Run the injector once with ``volume`` at /target, like an init container; its exit code."""
    spec = {
        "Image": image,
        "Entrypoint": argv[:1],
        "Cmd": argv[1:],
        "Labels": {label("role"): "agent-injector"},
        "HostConfig": {
            **docker_confinement(),
            "NetworkMode": "none",
            "Mounts": [{"Type": "volume", "Source": volume, "Target": "/target"}],
        },
    }
    try:
        container = await engine.create_container(None, spec)
    except EngineError as exc:
        raise BackendError(f"cannot run the agent injector {image!r}: {exc}") from exc
    try:
        await engine.start(container)
        return await engine.wait(container, timeout=120)
    except EngineError as exc:
        raise BackendError(f"the agent injector {image!r} failed: {exc}") from exc
    finally:
        await engine.remove(container)

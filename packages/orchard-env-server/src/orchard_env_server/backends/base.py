"""The contract every backend fulfils; the API layer knows nothing else about them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from ..records import SandboxRecord


class BackendError(Exception):
    """A sandbox could not be provisioned or has died; the message says why."""


class BackendUnavailable(BackendError):
    """The machinery behind sandboxes (an engine, an API server) does not answer now: the
    request is refused with 503 and changes nothing; retrying later is safe."""


class SandboxExists(BackendError):
    """Another sandbox (of any orchestrator replica) already has the requested id: the
    create is refused (409) and nothing of the other sandbox is touched."""


class ImageUnavailable(BackendError):
    """The image a create names cannot be had: the create is refused (nothing is made).

    ``reason`` is ``not_found`` (no such image: not stored, and the registry has none or
    pulling is off), ``pull_failed`` (the registry could not be reached or answered
    wrongly) or ``invalid`` (the reference itself is malformed).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@attrs.frozen
class BackendInfo:
    """Static facts for ``/health``: the isolation in force, what it consists of (one fact a
    line) and what an operator should know (no limits, no egress, an engine error)."""

    isolation: str
    isolation_details: list[str] = attrs.Factory(list)
    warnings: list[str] = attrs.Factory(list)


@attrs.frozen
class Resources:
    """Capacity and use for ``/resources``: what every backend reports, and ``details``
    of its own (engine version, namespace, watch statistics, ...)."""

    backend: str
    isolation: str
    sandboxes_running: int
    cpu_count: float | None
    memory_total_bytes: int | None
    details: Mapping[str, Any] = attrs.Factory(dict)

    def to_json(self) -> dict[str, Any]:
        """The ``/resources`` body: the common fields, then the backend's own."""
        common = attrs.asdict(self, filter=lambda a, _: a.name != "details")
        return {**common, **self.details}


RESTART_LOSS = "the sandbox died while the orchestrator was down and was cleaned up on restart"


class SandboxRegistry(Protocol):
    """What a backend that learns of sandboxes on its own (other replicas' pods) tells."""

    def discovered(self, record: SandboxRecord) -> None:
        """A sandbox this process did not create; its status is set already."""

    def lost(self, sandbox_id: str, reason: str) -> None:
        """A sandbox removed behind this process's back: it is ``terminated`` now."""

    def expired(self, sandbox_id: str) -> None:
        """A sandbox the machinery ended at its ttl (a pod's deadline): reap it now."""


class Backend(Protocol):
    """Owns the machinery behind sandboxes: processes, containers or pods."""

    name: str
    # True where sandboxes belong to something bigger than one orchestrator process (a
    # cluster shared by replicas): stopping the process then leaves them running.
    sandboxes_outlive_orchestrator: bool
    # Whether a pooled sandbox can be handed to a tenant (``claim``): see pools.py.
    supports_warm_pools: bool
    # Ports the agent itself listens on inside a sandbox: no service bridge may take them.
    reserved_ports: frozenset[int]

    def attach(self, registry: SandboxRegistry) -> None:
        """Called before ``start`` with the service, for backends that discover sandboxes."""

    async def start(self) -> list[SandboxRecord]:
        """Connect to the engine; return the sandboxes found again from an earlier run."""

    async def close(self, *, delete_sandboxes: bool) -> None:
        """Release connections; delete every sandbox when asked to."""

    async def create(self, record: SandboxRecord) -> None:
        """Provision the sandbox and set ``record.agent``; raise BackendError on failure."""

    async def wait_ready(self, record: SandboxRecord) -> None:
        """Return once the agent answers; raise BackendError with the reason if it never will."""

    async def delete(self, record: SandboxRecord) -> None:
        """Remove the sandbox and everything it holds; idempotent. ``retire`` then ``reap``."""

    async def retire(self, record: SandboxRecord) -> None:
        """The fast half of a delete: once it returns the sandbox runs nothing more and is
        doomed for good (a restarted orchestrator finishes its removal, never adopts it).
        A backend with nothing slow to defer does the whole delete here."""

    async def reap(self, record: SandboxRecord) -> None:
        """The rest of a retired sandbox's removal (may be slow; runs in the background)."""

    async def claim(self, record: SandboxRecord) -> None:
        """A pooled sandbox got its owner and settings: persist what a restart must know."""

    async def check(self, record: SandboxRecord) -> str | None:
        """None while the sandbox is alive, else why it is not."""

    def info(self) -> BackendInfo:
        """Static facts for ``/health`` (isolation mode, warnings)."""

    async def resources(self) -> Resources:
        """Capacity and use for ``/resources``."""

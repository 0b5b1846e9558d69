"""The orchestrator's record of one sandbox, and how it renders on the wire."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from .schemas import CreateSandboxRequest, Sandbox


@attrs.define
class AgentEndpoint:
    """How to reach the agent that serves a sandbox."""

    base_url: str
    token: str
    sandbox_header: str | None = None  # multi-sandbox agents select by X-Orchard-Sandbox
    uds: str | None = None  # reached over this unix socket (base_url then names no host)

    def headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}"}
        if self.sandbox_header:
            headers["X-Orchard-Sandbox"] = self.sandbox_header
        return headers


@attrs.define(eq=False)
class SandboxRecord:
    """Everything needed to serve one sandbox; backends persist what they must to recover it."""

    sandbox_id: str
    tenant: str
    image: str
    block_network: bool = True
    cpu: str | None = None
    memory: str | None = None
    timeout: float = 3600.0
    env: dict[str, str] = attrs.Factory(dict)
    workdir: str | None = None
    labels: dict[str, str] = attrs.Factory(dict)
    ttl_seconds: float | None = None
    idle_timeout_seconds: float | None = None
    bridges: dict[str, str] = attrs.Factory(dict)  # sandbox port → upstream URL
    created_at: float = attrs.Factory(time.time)
    status: str = "pending"
    error: str | None = None
    agent: AgentEndpoint | None = None
    backend_state: dict[str, Any] = attrs.Factory(dict)
    last_active: float = attrs.Factory(time.monotonic)
    finished_at: float | None = None
    # Requests using the sandbox right now (a waited exec, a stream, a transfer): a sandbox
    # in use is never idle, however long the request takes.
    busy: int = attrs.field(default=0, repr=False)
    settled: asyncio.Event = attrs.field(factory=asyncio.Event, repr=False)
    lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, repr=False)

    @classmethod
    def from_request(cls, sandbox_id: str, tenant: str, req: CreateSandboxRequest) -> SandboxRecord:
        return cls(
            sandbox_id=sandbox_id,
            tenant=tenant,
            image=req.image,
            block_network=True if req.block_network is None else req.block_network,
            cpu=req.cpu,
            memory=req.memory,
            timeout=3600.0 if req.timeout is None else float(req.timeout),
            env=dict(req.env or {}),
            workdir=req.workdir,
            labels=dict(req.labels or {}),
            ttl_seconds=req.ttl_seconds,
            idle_timeout_seconds=req.idle_timeout_seconds,
            bridges=dict(req.bridges or {}),
        )

    @property
    def expires_at(self) -> float | None:
        return None if self.ttl_seconds is None else self.created_at + self.ttl_seconds

    def touch(self) -> None:
        self.last_active = time.monotonic()

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """Mark the sandbox busy for the duration (the idle clock restarts at the end)."""
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1
            self.touch()

    def mark(self, status: str, error: str | None = None) -> None:
        self.status = status
        self.error = error
        if status in ("ready", "failed", "terminated"):
            self.settled.set()
        if status in ("failed", "terminated"):
            self.finished_at = time.monotonic()

    def info(self) -> Sandbox:
        return Sandbox(
            sandbox_id=self.sandbox_id,
            image=self.image,
            status=self.status,  # type: ignore[arg-type]
            block_network=self.block_network,
            cpu=self.cpu,
            memory=self.memory,
            timeout=self.timeout,
            created_at=self.created_at,
            labels=self.labels,
            ttl_seconds=self.ttl_seconds,
            idle_timeout_seconds=self.idle_timeout_seconds,
            expires_at=self.expires_at,
            error=self.error,
            bridges=self.bridges,
        )

    def to_persisted(self) -> dict[str, Any]:
        """The JSON a backend stores to find this sandbox again after a restart."""
        return {
            "sandbox_id": self.sandbox_id,
            "tenant": self.tenant,
            "image": self.image,
            "block_network": self.block_network,
            "cpu": self.cpu,
            "memory": self.memory,
            "timeout": self.timeout,
            "env": self.env,
            "workdir": self.workdir,
            "labels": self.labels,
            "ttl_seconds": self.ttl_seconds,
            "idle_timeout_seconds": self.idle_timeout_seconds,
            "bridges": self.bridges,
            "created_at": self.created_at,
            "agent": attrs.asdict(self.agent) if self.agent else None,
            "backend_state": self.backend_state,
        }

    @classmethod
    def from_persisted(cls, data: dict[str, Any]) -> SandboxRecord:
        agent = data.get("agent")
        fields = {k: v for k, v in data.items() if k != "agent"}
        record = cls(**fields)
        record.agent = AgentEndpoint(**agent) if agent else None
        return record


def save_record(home: Path, record: SandboxRecord) -> None:
    """Write ``home/record.json`` atomically, readable by the orchestrator's user only."""
    path = home / "record.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record.to_persisted()))
    tmp.chmod(0o600)
    tmp.replace(path)


def load_record(home: Path) -> SandboxRecord | None:
    """The record in ``home/record.json``; None when missing or unreadable."""
    try:
        return SandboxRecord.from_persisted(json.loads((home / "record.json").read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None

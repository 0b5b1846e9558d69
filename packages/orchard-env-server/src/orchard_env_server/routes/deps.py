"""Shared route dependencies: the service, the agent client, the caller's request id.

All are ``async def``: FastAPI runs a plain ``def`` dependency in a worker thread, which
costs a thread hop per dependency per request on the exec hot path.
"""

from __future__ import annotations

from fastapi import Request

from ..agent_client import AgentClient
from ..service import SandboxService


async def service(request: Request) -> SandboxService:
    svc: SandboxService = request.app.state.service
    return svc


async def agents(request: Request) -> AgentClient:
    client: AgentClient = request.app.state.agents
    return client


async def request_id(request: Request) -> str | None:
    rid: str | None = request.scope.get("state", {}).get("request_id")
    return rid

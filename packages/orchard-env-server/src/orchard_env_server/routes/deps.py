"""Shared route dependencies: the service, the agent client, the caller's request id."""

from __future__ import annotations

from fastapi import Request

from ..agent_client import AgentClient
from ..service import SandboxService


def service(request: Request) -> SandboxService:
    svc: SandboxService = request.app.state.service
    return svc


def agents(request: Request) -> AgentClient:
    client: AgentClient = request.app.state.agents
    return client


def request_id(request: Request) -> str | None:
    rid: str | None = request.scope.get("state", {}).get("request_id")
    return rid

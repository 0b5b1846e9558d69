"""The one dependency every sandbox route takes: who calls, and what serves them.

One ``async def`` dependency instead of one per need: FastAPI's dependency solving costs
per dependency per request, which showed as a fifth of the orchestrator's loop on the exec
hot path (and a plain ``def`` dependency would add a worker-thread hop each).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from ..agent_client import AgentClient
from ..auth import require_tenant
from ..service import SandboxService


@dataclass(frozen=True, slots=True)
class Caller:
    """A request's tenant and request id, with the service and agent client it uses."""

    tenant: str
    service: SandboxService
    agents: AgentClient
    request_id: str | None


def caller_of(request: HTTPConnection) -> Caller:
    """The request's caller; ApiError 401 without a valid API key when keys are set."""
    tenant = require_tenant(request)
    state = request.app.state
    rid: str | None = request.scope.get("state", {}).get("request_id")
    return Caller(tenant, state.service, state.agents, rid)


async def caller(request: Request) -> Caller:
    """FastAPI dependency: ``caller_of`` the request."""
    return caller_of(request)


Call = Annotated[Caller, Depends(caller)]

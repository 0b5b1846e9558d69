"""Commands: exec (waited, background, streamed), jobs, patches and the PTY."""

from __future__ import annotations

import contextlib
import functools
from typing import Annotated, Any

import websockets
from fastapi import APIRouter, Depends, Query, WebSocket
from fastapi.responses import JSONResponse, StreamingResponse

from orchard_env_agent.wsrelay import relay, requested_subprotocols

from ..agent_client import AgentClient, stream_body
from ..auth import presented_key, tenant_for
from ..errors import ApiError, job_not_found
from ..records import AgentEndpoint
from ..schemas import ApplyPatchRequest, ExecRequest, JobInfo, JobQueued, PatchResult
from ..service import SandboxService
from .deps import agents, request_id
from .sandboxes import Service, Tenant

router = APIRouter(tags=["commands"])
Agents = Annotated[AgentClient, Depends(agents)]
RequestId = Annotated[str | None, Depends(request_id)]
_GRACE_S = 30.0


def _exec_body(body: ExecRequest) -> dict[str, Any]:
    return body.model_dump(exclude_none=True)


@router.post("/sandboxes/{sandbox_id}/exec", response_model=JobInfo | JobQueued)
async def exec_command(
    sandbox_id: str, body: ExecRequest, tenant: Tenant, svc: Service, ag: Agents, rid: RequestId
) -> JSONResponse:
    """Run a command; ``wait: true`` answers with the finished job."""
    _, endpoint = svc.ready_endpoint(tenant, sandbox_id)
    timeout = (body.timeout_seconds or 300) + _GRACE_S if body.wait else _GRACE_S
    async with svc.slot():
        job = await ag.request(
            endpoint, "POST", "/exec", json=_exec_body(body), timeout=timeout, request_id=rid
        )
    return JSONResponse(job)


@router.post("/sandboxes/{sandbox_id}/exec/stream")
async def exec_stream(
    sandbox_id: str, body: ExecRequest, tenant: Tenant, svc: Service, ag: Agents
) -> StreamingResponse:
    """Stream NDJSON output events as they appear, ending with an ``exit`` event."""
    _, endpoint = svc.ready_endpoint(tenant, sandbox_id)
    response = await ag.open_stream(
        endpoint, "POST", "/exec/stream", json=_exec_body(body), timeout=None
    )

    return StreamingResponse(stream_body(response), media_type="application/x-ndjson")


def _job_sandbox(svc: SandboxService, tenant: str, job_id: str) -> AgentEndpoint:
    sandbox_id, sep, _ = job_id.partition(".")
    if not sep:
        raise job_not_found(job_id)
    try:
        record = svc.get(tenant, sandbox_id)
    except ApiError:
        raise job_not_found(job_id) from None
    if record.agent is None or record.status != "ready":
        reason = record.error or f"sandbox is {record.status}"
        raise ApiError(409, "sandbox_not_ready", f"job {job_id!r} is unavailable: {reason}")
    return record.agent


async def _job_call(ag: AgentClient, endpoint: AgentEndpoint, method: str, path: str, job_id: str,
                    **kwargs: Any) -> Any:  # fmt: skip
    try:
        return await ag.request(endpoint, method, path, **kwargs)
    except ApiError as exc:
        if exc.status == 404:
            raise ApiError(
                404,
                "job_not_found",
                f"job {job_id!r} is not known to the sandbox's agent (never existed, evicted, "
                "or lost when the agent restarted)",
            ) from None
        raise


@router.get("/jobs/{job_id}", response_model=JobInfo)
async def get_job(job_id: str, tenant: Tenant, svc: Service, ag: Agents) -> JSONResponse:
    endpoint = _job_sandbox(svc, tenant, job_id)
    return JSONResponse(await _job_call(ag, endpoint, "GET", f"/jobs/{job_id}", job_id))


@router.get("/jobs/{job_id}/wait", response_model=JobInfo)
async def wait_job(
    job_id: str,
    tenant: Tenant,
    svc: Service,
    ag: Agents,
    timeout: Annotated[float, Query(gt=0, le=3600)] = 60.0,
) -> JSONResponse:
    """The job once finished, or as it is when ``timeout`` runs out (status ``running``)."""
    endpoint = _job_sandbox(svc, tenant, job_id)
    job = await _job_call(
        ag, endpoint, "GET", f"/jobs/{job_id}/wait", job_id,
        params={"timeout": timeout}, timeout=timeout + _GRACE_S,
    )  # fmt: skip
    return JSONResponse(job)


@router.post("/jobs/{job_id}/cancel", response_model=JobInfo)
async def cancel_job(job_id: str, tenant: Tenant, svc: Service, ag: Agents) -> JSONResponse:
    endpoint = _job_sandbox(svc, tenant, job_id)
    return JSONResponse(await _job_call(ag, endpoint, "POST", f"/jobs/{job_id}/cancel", job_id))


@router.post("/sandboxes/{sandbox_id}/apply_patch", response_model=PatchResult)
async def apply_patch(
    sandbox_id: str, body: ApplyPatchRequest, tenant: Tenant, svc: Service, ag: Agents
) -> JSONResponse:
    """``git apply``, then a 3-way apply, then ``patch --fuzz``, in the exec cwd."""
    record, endpoint = svc.ready_endpoint(tenant, sandbox_id)
    async with svc.slot(), record.lock:
        result = await ag.request(
            endpoint, "POST", "/apply_patch", json=body.model_dump(exclude_none=True),
            timeout=3 * (body.timeout_seconds or 30) + _GRACE_S,
        )  # fmt: skip
    return JSONResponse(result)


@router.websocket("/sandboxes/{sandbox_id}/exec/pty")
async def exec_pty(websocket: WebSocket, sandbox_id: str) -> None:
    """Interactive terminal: binary frames both ways, relayed to the agent's PTY."""
    await proxy_websocket(websocket, sandbox_id, "/exec/pty")


async def proxy_websocket(websocket: WebSocket, sandbox_id: str, agent_path: str) -> None:
    """Authenticate, then relay a client WebSocket to the sandbox agent's ``agent_path``."""
    app = websocket.app
    try:
        tenant = tenant_for(app.state.settings.api_keys, presented_key(websocket))  # type: ignore[arg-type]
        _, endpoint = app.state.service.ready_endpoint(tenant, sandbox_id)
    except ApiError as exc:
        await websocket.close(code=4000 + exc.status, reason=exc.detail[:120])
        return
    url = endpoint.base_url.replace("http://", "ws://", 1) + agent_path
    if websocket.url.query:
        url += "?" + websocket.url.query
    try:
        connect = (
            functools.partial(websockets.unix_connect, endpoint.uds)
            if endpoint.uds
            else websockets.connect
        )
        async with connect(
            url, additional_headers=endpoint.headers(), max_size=None,
            subprotocols=requested_subprotocols(websocket),  # type: ignore[arg-type]
        ) as upstream:  # fmt: skip
            await websocket.accept(subprotocol=upstream.subprotocol)
            await relay(websocket, upstream)
    except (OSError, websockets.WebSocketException) as exc:
        with contextlib.suppress(Exception):
            await websocket.close(code=1011, reason=f"sandbox agent: {exc}"[:120])

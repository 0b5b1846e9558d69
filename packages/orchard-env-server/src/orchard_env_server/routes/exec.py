"""Commands: exec (waited, background, streamed), jobs, patches and the PTY."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any
from urllib.parse import unquote_plus

import websockets
from fastapi import APIRouter, Query, WebSocket
from fastapi.responses import JSONResponse, StreamingResponse

from orchard_env_agent.wsrelay import relay, requested_subprotocols

from ..agent_client import AgentUnreachable, stream_body
from ..auth import presented_key, tenant_for
from ..errors import ApiError, job_not_found
from ..records import AgentEndpoint, SandboxRecord
from ..schemas import ApplyPatchRequest, ExecRequest, Job, JobQueued, PatchResult
from ..service import SandboxService
from ..unix_sockets import pinned_socket
from .deps import Call, Caller

router = APIRouter(tags=["commands"])
_GRACE_S = 30.0


def _exec_body(body: ExecRequest, job_id: str) -> dict[str, Any]:
    return {**body.model_dump(exclude_none=True), "job_id": job_id}


def _lost_reason(why: str) -> str:
    return f"the sandbox's agent went away while the job ran ({why})"


@router.post("/sandboxes/{sandbox_id}/exec", response_model=Job | JobQueued)
async def exec_command(sandbox_id: str, body: ExecRequest, call: Call) -> JSONResponse:
    """Run a command; ``wait: true`` answers with the finished job.

    If the sandbox's agent dies before a waited job ends, the answer is that job, ``failed``
    with the reason (the orchestrator picked its id, so it can say which job was lost).
    """
    return JSONResponse(await run_exec(call, sandbox_id, body))


async def run_exec(call: Caller, sandbox_id: str, body: ExecRequest) -> Any:
    """The exec route's work, shared with its fast path (``exec_fast_path.py``): the job
    as the agent answered it, or as the ledger answers for a waited job whose agent died."""
    svc, tenant = call.service, call.tenant
    record, endpoint = svc.ready_endpoint(tenant, sandbox_id)
    timeout = (body.timeout_seconds or 300) + _GRACE_S if body.wait else _GRACE_S
    async with svc.slot():
        job_id = svc.jobs.open(sandbox_id, tenant, body.command)
        try:
            with record.in_use():
                job = await call.agents.request(
                    endpoint,
                    "POST",
                    "/exec",
                    json=_exec_body(body, job_id),
                    timeout=timeout,
                    request_id=call.request_id,
                )
        except AgentUnreachable as exc:
            svc.agent_gone(record)
            lost = svc.jobs.lost(job_id, _lost_reason(exc.detail), tenant)
            if not body.wait or lost is None:
                raise
            return lost
        except ApiError:
            svc.jobs.discard(job_id)
            raise
    return svc.jobs.observe(job)


@router.post(
    "/sandboxes/{sandbox_id}/exec/stream",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "NDJSON events, the last one of type exit",
            "content": {"application/x-ndjson": {}},
        }
    },
)
async def exec_stream(sandbox_id: str, body: ExecRequest, call: Call) -> StreamingResponse:
    """Stream NDJSON output events as they appear, ending with an ``exit`` event.

    A stream whose agent dies midway still ends with an ``exit`` event: the job, ``failed``.
    """
    svc, tenant = call.service, call.tenant
    record, endpoint = svc.ready_endpoint(tenant, sandbox_id)
    job_id = svc.jobs.open(sandbox_id, tenant, body.command)
    try:
        response = await call.agents.open_stream(
            endpoint, "POST", "/exec/stream", json=_exec_body(body, job_id), timeout=None
        )
    except ApiError:
        svc.jobs.discard(job_id)
        raise

    async def events() -> AsyncIterator[bytes]:
        tail = b""
        try:
            with record.in_use():
                async for chunk in stream_body(response):
                    tail = (tail + chunk)[-1:]
                    yield chunk
        except AgentUnreachable as exc:
            svc.agent_gone(record)
            lost = svc.jobs.lost(job_id, _lost_reason(exc.detail), tenant)
            if lost is not None:
                yield (b"\n" if tail not in (b"", b"\n") else b"") + (
                    json.dumps({"type": "exit", **lost}) + "\n"
                ).encode()
        else:
            svc.jobs.discard(job_id)

    return StreamingResponse(events(), media_type="application/x-ndjson")


def _job_sandbox(
    svc: SandboxService, tenant: str, job_id: str
) -> tuple[SandboxRecord | None, AgentEndpoint | None]:
    """The job's sandbox and its agent; no agent when the sandbox cannot serve any more."""
    sandbox_id, sep, _ = job_id.partition(".")
    if not sep:
        raise job_not_found(job_id)
    try:
        record = svc.get(tenant, sandbox_id)
    except ApiError:
        if svc.jobs.declared_lost(job_id, tenant) is not None:
            return None, None
        raise job_not_found(job_id) from None
    if record.agent is None or record.status != "ready":
        reason = record.error or f"sandbox is {record.status}"
        if svc.jobs.lost(job_id, f"the sandbox stopped serving: {reason}", tenant) is not None:
            return record, None
        raise ApiError(409, "sandbox_not_ready", f"job {job_id!r} is unavailable: {reason}")
    return record, record.agent


async def _job_call(call: Call, method: str, suffix: str, job_id: str, **kwargs: Any) -> Any:
    """Ask the job's agent; answer for a job the agent lost (it died, or restarted)."""
    svc, ag, tenant = call.service, call.agents, call.tenant
    record, endpoint = _job_sandbox(svc, tenant, job_id)
    if endpoint is None:
        return svc.jobs.declared_lost(job_id, tenant)
    assert record is not None
    try:
        with record.in_use():
            answer = await ag.request(endpoint, method, f"/jobs/{job_id}{suffix}", **kwargs)
        return svc.jobs.observe(answer)
    except AgentUnreachable as exc:
        svc.agent_gone(record)
        lost = svc.jobs.lost(job_id, _lost_reason(exc.detail), tenant)
        if lost is None:
            raise
        return lost
    except ApiError as exc:
        if exc.status != 404:
            raise
        if exc.code == "job_evicted":  # it finished; the agent kept newer results instead
            svc.jobs.discard(job_id)
            raise
        lost = svc.jobs.lost(
            job_id, "the sandbox's agent no longer knows it (it restarted)", tenant
        )
        if lost is not None:
            return lost
        raise ApiError(
            404,
            "job_not_found",
            f"job {job_id!r} is not known to the sandbox's agent (never existed, evicted, "
            "or lost when the agent restarted)",
        ) from None


@router.get("/jobs/{job_id}", response_model=Job)
async def get_job(job_id: str, call: Call) -> JSONResponse:
    return JSONResponse(await _job_call(call, "GET", "", job_id))


@router.get("/jobs/{job_id}/wait", response_model=Job)
async def wait_job(
    job_id: str,
    call: Call,
    timeout: Annotated[float, Query(gt=0, le=3600)] = 60.0,
) -> JSONResponse:
    """The job once finished, or as it is when ``timeout`` runs out (status ``running``)."""
    job = await _job_call(
        call, "GET", "/wait", job_id, params={"timeout": timeout}, timeout=timeout + _GRACE_S
    )
    return JSONResponse(job)


@router.post("/jobs/{job_id}/cancel", response_model=Job)
async def cancel_job(job_id: str, call: Call) -> JSONResponse:
    return JSONResponse(await _job_call(call, "POST", "/cancel", job_id))


@router.post("/sandboxes/{sandbox_id}/apply_patch", response_model=PatchResult)
async def apply_patch(sandbox_id: str, body: ApplyPatchRequest, call: Call) -> JSONResponse:
    """``git apply``, then a 3-way apply, then ``patch --fuzz``, in the exec cwd."""
    svc = call.service
    record, endpoint = svc.ready_endpoint(call.tenant, sandbox_id)
    async with svc.slot(), record.lock:
        result = await call.agents.request(
            endpoint,
            "POST",
            "/apply_patch",
            json=body.model_dump(exclude_none=True),
            timeout=3 * (body.timeout_seconds or 30) + _GRACE_S,
        )
    return JSONResponse(result)


@router.websocket("/sandboxes/{sandbox_id}/exec/pty")
async def exec_pty(websocket: WebSocket, sandbox_id: str) -> None:
    """Interactive terminal, relayed to the agent's PTY: our binary frames, or the public
    Orchard Env SDK's JSON frames (the agent tells them apart by the first frame)."""
    await proxy_websocket(websocket, sandbox_id, "/exec/pty", query_key=True)


_QUERY_KEY = "api_key"


def _websocket_key(websocket: WebSocket) -> str | None:
    """The API key as for HTTP, else ``?api_key=`` (where the public SDK's terminal client
    sends it; a browser's WebSocket cannot set headers either)."""
    return presented_key(websocket) or websocket.query_params.get(_QUERY_KEY)


def _query_without_key(query: str) -> str:
    """The query string as sent, less any ``api_key`` (never passed on to the sandbox)."""
    parts = [part for part in query.split("&") if part]
    return "&".join(p for p in parts if unquote_plus(p.partition("=")[0]) != _QUERY_KEY)


async def proxy_websocket(
    websocket: WebSocket, sandbox_id: str, agent_path: str, *, query_key: bool = False
) -> None:
    """Authenticate, then relay a client WebSocket to the sandbox agent's ``agent_path``.

    ``query_key``: the key may also come as ``?api_key=``, which is then not passed on.
    """
    app = websocket.app
    key = _websocket_key(websocket) if query_key else presented_key(websocket)
    try:
        tenant = tenant_for(app.state.settings.api_keys, key)
        record, endpoint = app.state.service.ready_endpoint(tenant, sandbox_id)
    except ApiError as exc:
        await websocket.close(code=4000 + exc.status, reason=exc.detail[:120])
        return
    url = endpoint.base_url.replace("http://", "ws://", 1) + agent_path
    query = _query_without_key(websocket.url.query) if query_key else websocket.url.query
    if query:
        url += "?" + query
    try:
        with contextlib.ExitStack() as pins:
            path = pins.enter_context(pinned_socket(endpoint.uds)) if endpoint.uds else None
            connect = (
                functools.partial(websockets.unix_connect, path) if path else websockets.connect
            )
            async with connect(
                url,
                additional_headers=endpoint.headers(),
                max_size=None,
                subprotocols=requested_subprotocols(websocket),  # type: ignore[arg-type]
            ) as upstream:
                await websocket.accept(subprotocol=upstream.subprotocol)
                with record.in_use():  # a terminal in use keeps its sandbox from idling out
                    await relay(websocket, upstream)
    except (OSError, websockets.WebSocketException) as exc:
        with contextlib.suppress(Exception):
            await websocket.close(code=1011, reason=f"sandbox agent: {exc}"[:120])

"""Sandbox lifecycle routes: create, list, get, wait, heartbeat, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from ..errors import bad_request
from ..schemas import CreateSandboxRequest, DeleteResult, Sandbox, SandboxList
from .deps import Call

router = APIRouter(tags=["sandboxes"])


def _parse_labels(raw: list[str]) -> dict[str, str]:
    labels = {}
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise bad_request(f"label filter {item!r} must look like key=value")
        labels[key] = value
    return labels


@router.post("/sandboxes", status_code=201, response_model=Sandbox)
async def create_sandbox(body: CreateSandboxRequest, call: Call) -> JSONResponse:
    """Create a sandbox; answers at once with its status (usually already ``ready``)."""
    record = await call.service.create(call.tenant, body)
    return JSONResponse(record.info().model_dump(), status_code=201)


@router.get("/sandboxes", response_model=SandboxList)
async def list_sandboxes(
    call: Call,
    # ``_parse_labels`` enforces the form (400); the schema says so to clients.
    label: Annotated[
        list[str], Query(json_schema_extra={"items": {"type": "string", "pattern": "^[^=]+="}})
    ] = [],  # noqa: B006
) -> SandboxList:
    """This tenant's sandboxes, optionally filtered by ``?label=k=v`` (repeatable)."""
    found = call.service.list(call.tenant, _parse_labels(label))
    return SandboxList(sandboxes=[r.info() for r in found])


@router.get("/sandboxes/{sandbox_id}", response_model=Sandbox)
async def get_sandbox(sandbox_id: str, call: Call) -> Sandbox:
    return call.service.get(call.tenant, sandbox_id).info()


@router.get("/sandboxes/{sandbox_id}/wait", response_model=Sandbox)
async def wait_sandbox(
    sandbox_id: str,
    call: Call,
    timeout: Annotated[float, Query(gt=0, le=3600)] = 60.0,
) -> Sandbox:
    """Block until ready or failed; 408 when ``timeout`` runs out first."""
    return (await call.service.wait(call.tenant, sandbox_id, timeout)).info()


@router.post("/sandboxes/{sandbox_id}/heartbeat", response_model=Sandbox)
async def heartbeat(sandbox_id: str, call: Call) -> Sandbox:
    """Refresh the idle timer (any request does; this one does nothing else)."""
    return call.service.get(call.tenant, sandbox_id).info()


@router.delete("/sandboxes/{sandbox_id}", response_model=DeleteResult)
async def delete_sandbox(sandbox_id: str, call: Call) -> DeleteResult:
    await call.service.delete(call.tenant, sandbox_id)
    return DeleteResult(status="deleted", sandbox_id=sandbox_id)

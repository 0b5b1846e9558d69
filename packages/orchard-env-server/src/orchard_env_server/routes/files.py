"""File routes: base64 JSON for small files, raw streaming and tar for large data."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from orchard_env_agent.files import UPLOAD_CAP_HEADER

from ..agent_client import forwardable_headers, stream_body
from ..errors import too_large
from ..schemas import FileContent, FileList, WriteFileRequest, WriteFileResult
from .deps import Call

router = APIRouter(tags=["files"])
PathParam = Annotated[str, Query(min_length=1, max_length=4096)]


@router.post("/sandboxes/{sandbox_id}/files", response_model=WriteFileResult)
async def write_file(sandbox_id: str, body: WriteFileRequest, call: Call) -> JSONResponse:
    """Write base64 ``content`` to ``path`` atomically; parent directories are created."""
    svc = call.service
    _, endpoint = svc.ready_endpoint(call.tenant, sandbox_id)
    if len(body.content) * 3 // 4 > svc.settings.max_json_file_bytes:
        raise too_large(
            f"base64 uploads are capped at {svc.settings.max_json_file_bytes} bytes; "
            "use PUT /sandboxes/{id}/fs for large files"
        )
    async with svc.slot():
        result = await call.agents.request(
            endpoint, "POST", "/files", json=body.model_dump(), timeout=300
        )
    return JSONResponse(result)


@router.get("/sandboxes/{sandbox_id}/files", response_model=FileContent)
async def read_file(sandbox_id: str, path: PathParam, call: Call) -> JSONResponse:
    svc = call.service
    _, endpoint = svc.ready_endpoint(call.tenant, sandbox_id)
    async with svc.slot():
        result = await call.agents.request(
            endpoint, "GET", "/files", params={"path": path}, timeout=300
        )
    return JSONResponse(result)


@router.get("/sandboxes/{sandbox_id}/files/list", response_model=FileList)
async def list_files(sandbox_id: str, path: PathParam, call: Call) -> JSONResponse:
    _, endpoint = call.service.ready_endpoint(call.tenant, sandbox_id)
    listing = await call.agents.request(endpoint, "GET", "/files/list", params={"path": path})
    return JSONResponse(listing)


_RAW_BODY: dict[str, Any] = {
    "requestBody": {  # read as a stream, so FastAPI cannot infer it; documented here
        "description": "The file's raw bytes, or a tar archive with ``archive=tar``",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.put("/sandboxes/{sandbox_id}/fs", response_model=WriteFileResult, openapi_extra=_RAW_BODY)
async def put_raw(
    sandbox_id: str,
    path: PathParam,
    request: Request,
    call: Call,
    archive: Literal["tar"] | None = None,
) -> JSONResponse:
    """Stream the raw body to ``path`` (or unpack a tar into it with ``archive=tar``)."""
    svc = call.service
    record, endpoint = svc.ready_endpoint(call.tenant, sandbox_id)
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > svc.settings.max_upload_bytes:
        raise too_large(
            f"upload of {length} bytes exceeds the cap of {svc.settings.max_upload_bytes}"
        )
    params = {"path": path, **({"archive": archive} if archive else {})}
    headers = {"content-length": length} if length else {}
    headers[UPLOAD_CAP_HEADER] = str(svc.settings.max_upload_bytes)
    cap = svc.settings.max_upload_bytes
    with record.in_use():
        async with svc.slot():
            body = _capped(request.stream(), cap)
            response = await call.agents.open_stream(
                endpoint, "PUT", "/fs", params=params, content=body, headers=headers, timeout=None
            )
            try:
                await response.aread()
            finally:
                await response.aclose()
    return JSONResponse(response.json(), status_code=response.status_code)


async def _capped(source: AsyncIterator[bytes], cap: int) -> AsyncIterator[bytes]:
    """Pass a chunked upload through until it exceeds ``cap`` bytes, then end it there.

    The agent, told the same cap (``X-Orchard-Upload-Cap``), sees a body over its cap,
    removes its temp file and answers 413 itself; the orchestrator relays that answer, so
    when the client hears 413 nothing is left in the sandbox, not even briefly. (An upload
    with a Content-Length over the cap never starts; one within it cannot grow past it.)
    """
    seen = 0
    async for chunk in source:
        seen += len(chunk)
        yield chunk
        if seen > cap:
            return


_RAW_CONTENT: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The file's bytes, or a tar of the directory with ``archive=tar``",
        "content": {"application/octet-stream": {}, "application/x-tar": {}},
    }
}


@router.get("/sandboxes/{sandbox_id}/fs", response_class=Response, responses=_RAW_CONTENT)
async def get_raw(
    sandbox_id: str,
    path: PathParam,
    call: Call,
    archive: Literal["tar"] | None = None,
) -> StreamingResponse:
    """Stream a file's raw bytes, or a tar of a directory with ``archive=tar``."""
    record, endpoint = call.service.ready_endpoint(call.tenant, sandbox_id)
    params = {"path": path, **({"archive": archive} if archive else {})}
    response = await call.agents.open_stream(endpoint, "GET", "/fs", params=params, timeout=None)

    async def body() -> AsyncIterator[bytes]:
        with record.in_use():
            async for chunk in stream_body(response):
                yield chunk

    return StreamingResponse(
        body(),
        status_code=response.status_code,
        headers=forwardable_headers(response.headers),
        media_type=response.headers.get("content-type", "application/octet-stream"),
    )

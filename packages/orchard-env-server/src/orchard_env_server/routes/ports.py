"""Forward HTTP requests to a port inside the sandbox, through its agent."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, WebSocket
from fastapi.responses import Response, StreamingResponse

from orchard_env_agent.ports import quote_path

from ..agent_client import forwardable_headers, stream_body
from ..schemas import ErrorBody
from .deps import Call
from .exec import proxy_websocket

router = APIRouter(tags=["ports"])
_STRIP = {"x-api-key", "authorization", "host", "content-length", "x-orchard-sandbox"}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    "default": {
        "description": "The sandboxed service's own answer (any status and body), passed through",
        "content": {"*/*": {}},
    },
    502: {"model": ErrorBody, "description": "Nothing listens on the port, or a bad answer"},
}


async def forward_port(
    sandbox_id: str,
    port: Annotated[int, Path(ge=1, le=65535)],
    path: str,
    request: Request,
    call: Call,
) -> StreamingResponse:
    """Method, headers (minus auth) and body pass through; the answer streams back."""
    _, endpoint = call.service.ready_endpoint(call.tenant, sandbox_id)
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _STRIP}
    target = f"/ports/{port}/{quote_path(path)}"  # path arrives decoded
    response = await call.agents.open_stream(
        endpoint,
        request.method,
        target,
        params=list(request.query_params.multi_items()),
        content=request.stream(),
        headers=headers,
        timeout=None,
        passthrough_errors=True,
    )

    return StreamingResponse(
        stream_body(response),
        status_code=response.status_code,
        headers=forwardable_headers(response.headers),
    )


for _method in ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"):
    router.add_api_route(
        "/sandboxes/{sandbox_id}/ports/{port}/{path:path}",
        forward_port,
        methods=[_method],
        operation_id=f"forward_port_{_method.lower()}",
        response_class=Response,
        responses=_RESPONSES,
    )


@router.websocket("/sandboxes/{sandbox_id}/ports/{port}/{path:path}")
async def forward_port_websocket(
    websocket: WebSocket, sandbox_id: str, port: int, path: str
) -> None:
    """A WebSocket to a server inside the sandbox, relayed frame by frame via the agent."""
    await proxy_websocket(websocket, sandbox_id, f"/ports/{port}/{quote_path(path)}")

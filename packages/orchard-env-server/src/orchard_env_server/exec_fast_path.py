"""The exec route's fast path: ``POST /sandboxes/{id}/exec`` without FastAPI's routing,
dependency solving and inner middleware, which cost the orchestrator more CPU per exec
than its call to the sandbox's agent (docs/performance.md).

It takes only a request it can answer exactly as the route would: a JSON body of known
length, at most ``MAX_BODY`` bytes, that validates as an ``ExecRequest``, from a caller
whose key is valid. Anything else goes to the route unchanged, with the body it read
replayed, so every refusal is the route's own. A request it takes gets the route's work
(``run_exec``) and, for an exception, the app's own handler for it.
"""

from __future__ import annotations

import json
import re

from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ApiError
from .routes.deps import Caller, caller_of
from .routes.exec import run_exec
from .schemas import ExecRequest

MAX_BODY = 1 << 20
_PATH = re.compile(r"/sandboxes/([^/]+)/exec")


class _ExecRoute:
    """What the access log and the request metrics read from ``scope["route"]``."""

    path = "/sandboxes/{sandbox_id}/exec"


class ExecFastPath:
    """ASGI middleware serving the exec route's ordinary requests itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sandbox_id = _exec_target(scope)
        length = _json_length(scope) if sandbox_id is not None else None
        if sandbox_id is None or length is None or length > MAX_BODY:
            await self.app(scope, receive, send)
            return
        body, disconnected = await _read_body(receive)
        if disconnected:
            return  # the client is gone before its request arrived: nothing was started
        request = Request(scope, receive)
        accepted = _accepted(request, body)
        if accepted is None:
            await self.app(scope, _replaying(body, receive), send)
            return
        call, exec_request = accepted
        scope["route"] = _ExecRoute
        try:
            response = JSONResponse(await run_exec(call, sandbox_id, exec_request))
        except Exception as exc:
            response = await _handled(request, exc)
        await response(scope, receive, send)


def _exec_target(scope: Scope) -> str | None:
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    match = _PATH.fullmatch(scope["path"])
    return match.group(1) if match else None


def _json_length(scope: Scope) -> int | None:
    """The body's declared length when the body is declared JSON; None otherwise."""
    length = media = None
    for name, value in scope["headers"]:
        if name == b"content-length":
            length = value
        elif name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
    if media != b"application/json" or length is None or not length.isdigit():
        return None
    return int(length)


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"", True
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), False


def _accepted(request: Request, body: bytes) -> tuple[Caller, ExecRequest] | None:
    """The caller and the body as the route would take them; None if it would refuse."""
    try:
        return caller_of(request), ExecRequest.model_validate(json.loads(body))
    except (ApiError, ValueError, ValidationError):  # JSON and decoding errors are ValueErrors
        return None


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands over ``body`` first, then whatever the client sends next."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


async def _handled(request: Request, exc: Exception) -> JSONResponse:
    """The response the app's handler for ``exc`` gives (the route's errors, 500 else)."""
    handlers = request.app.exception_handlers
    for kind in type(exc).__mro__:
        handler = handlers.get(kind)
        if handler is not None:
            response: JSONResponse = await handler(request, exc)
            return response
    raise exc

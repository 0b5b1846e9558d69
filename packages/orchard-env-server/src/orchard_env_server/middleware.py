"""Request ids, access logs and request metrics, as plain ASGI (cheap on the hot path)."""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import metrics

access_log = logging.getLogger("orchard_env_server.access")


def _route_template(scope: Scope) -> str:
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"


class RequestContextMiddleware:
    """Echo or mint ``X-Request-ID``; record latency and status per route."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        request_id = ""
        for name, value in scope.get("headers", ()):
            if name == b"x-request-id":
                request_id = value.decode("latin-1")[:128]
                break
        request_id = request_id or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", ()))
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if scope["type"] == "http":
                elapsed = time.perf_counter() - started
                route = _route_template(scope)
                metrics.REQUESTS.labels(scope["method"], route, str(status)).inc()
                metrics.LATENCY.labels(scope["method"], route).observe(elapsed)
                if access_log.isEnabledFor(logging.INFO):
                    access_log.info(json.dumps(_log_fields(scope, status, elapsed, request_id)))


def _log_fields(scope: Scope, status: int, elapsed: float, request_id: str) -> dict[str, Any]:
    state = scope.get("state", {})
    return {
        "request_id": request_id,
        "method": scope["method"],
        "path": scope["path"],
        "status": status,
        "ms": round(elapsed * 1000, 2),
        "tenant": state.get("tenant"),
    }

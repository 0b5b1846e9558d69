"""Helpers: a scripted fake Orchard Env server for the client's unit tests (httpx.MockTransport)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx


def sandbox_json(sandbox_id: str = "sb-1", status: str = "ready", **extra: Any) -> dict[str, Any]:
    return {
        "sandbox_id": sandbox_id,
        "image": "host",
        "status": status,
        "block_network": True,
        "cpu": None,
        "memory": None,
        "timeout": 600,
        "created_at": 1.0,
        "labels": {},
        "ttl_seconds": None,
        "idle_timeout_seconds": None,
        "expires_at": None,
        "error": None,
        **extra,
    }


def job_json(job_id: str = "job-1", status: str = "succeeded", **extra: Any) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "sandbox_id": "sb-1",
        "command": "echo hi",
        "status": status,
        "stdout": "hi\n" if status == "succeeded" else "",
        "stderr": "",
        "exit_code": 0 if status == "succeeded" else None,
        "created_at": 1.0,
        "started_at": 1.0,
        "completed_at": 2.0 if status == "succeeded" else None,
        "error": None,
        **extra,
    }


Reply = httpx.Response | Callable[[httpx.Request], httpx.Response]


class FakeServer:
    """Routes ``"METHOD /path"`` to a queue of replies (the last one repeats); records calls."""

    def __init__(self) -> None:
        self.routes: dict[str, list[Reply]] = {}
        self.requests: list[httpx.Request] = []

    def on(self, method: str, path: str, *replies: Reply) -> FakeServer:
        self.routes[f"{method} {path}"] = list(replies)
        return self

    def calls(self, method: str, path: str) -> list[httpx.Request]:
        return [r for r in self.requests if r.method == method and r.url.path == path]

    def handler(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        key = f"{request.method} {request.url.path}"
        queue = self.routes.get(key)
        if not queue:
            return httpx.Response(404, json={"detail": f"no route {key}", "code": "no_route"})
        reply = queue.pop(0) if len(queue) > 1 else queue[0]
        return reply(request) if callable(reply) else reply

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handler)


def body(request: httpx.Request) -> Any:
    return json.loads(request.content)

"""The HTTP layer: headers, request ids, retries and error mapping for every call.

Retry policy (kept deliberately simple): a request marked ``idempotent`` (GET, DELETE,
heartbeat, waits, raw PUT of a re-readable body, and ``POST /sandboxes`` with an explicit
``sandbox_id``) is retried up to ``max_retries`` times on 503 and on transport errors, with
jittered exponential backoff; a 503's ``Retry-After`` is honoured, capped at
``retry_after_cap``. Everything else (exec, create without an id, cancel, patch) is sent
exactly once, because a retry could run it twice.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx

from .errors import ConnectionFailed, Overloaded, PayloadTooLarge, error_from_response

DEFAULT_URL = "http://127.0.0.1:8000"
ENV_URL = "ORCHARD_ENV_URL"
ENV_API_KEY = "ORCHARD_ENV_API_KEY"

_sleep = asyncio.sleep  # tests patch this to skip real backoff delays

Content = bytes | Callable[[], AsyncIterator[bytes]] | None


@attrs.define(frozen=True)
class RetryPolicy:
    """How idempotent requests are retried (see the module docstring)."""

    max_retries: int = 3
    backoff_base: float = 0.25
    backoff_cap: float = 8.0
    retry_after_cap: float = 30.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        if retry_after is not None:
            return min(retry_after, self.retry_after_cap)
        ceiling = min(self.backoff_cap, self.backoff_base * (2**attempt))
        return ceiling * random.uniform(0.5, 1.0)


def default_transport(max_connections: int = 100) -> httpx.AsyncBaseTransport | None:
    """aiohttp under httpx when it is installed (faster; see ``_aiohttp_transport``), else
    None: httpx's own."""
    try:
        from ._aiohttp_transport import AiohttpTransport, wanted
    except ImportError:
        return None
    return AiohttpTransport(limit=max_connections) if wanted() else None


def pooled_transport(max_connections: int) -> httpx.AsyncBaseTransport:
    """The SDK's default transport with a pool of at most ``max_connections`` (for
    ``AsyncSandboxClient(transport=...)`` when one client should hold fewer or more)."""
    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections
    )
    return default_transport(max_connections) or httpx.AsyncHTTPTransport(limits=limits)


def new_request_id() -> str:
    """A fresh ``X-Request-ID`` value."""
    return uuid.uuid4().hex


class HttpCore:
    """Owns the ``httpx.AsyncClient`` and sends every request of the SDK."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        timeout: float,
        retry: RetryPolicy,
        transport: httpx.AsyncBaseTransport | None,
    ) -> None:
        self.base_url = (base_url or os.environ.get(ENV_URL) or DEFAULT_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get(ENV_API_KEY)
        self.timeout = timeout
        self.retry = retry
        headers = {"User-Agent": "orchard-env-client"}
        if self.api_key:
            headers["X-API-Key"] = self.api_key
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            transport=transport if transport is not None else default_transport(),
        )

    @property
    def closed(self) -> bool:
        """True once ``aclose`` has run."""
        return self._client.is_closed

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    def _build(
        self,
        method: str,
        path: str,
        request_id: str,
        json: Any,
        params: Any,
        content: Content,
        timeout: float | None,
    ) -> httpx.Request:
        headers = {"X-Request-ID": request_id}
        body: Any = None
        if content is not None:
            body = content if isinstance(content, bytes) else content()
            headers["Content-Type"] = "application/octet-stream"
        extensions = {}
        if timeout is not None:
            extensions["timeout"] = httpx.Timeout(max(timeout, self.timeout)).as_dict()
        return self._client.build_request(
            method,
            path,
            json=json,
            params=params,
            content=body,
            headers=headers,
            extensions=extensions,
        )

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | list[tuple[str, Any]] | None = None,
        content: Content = None,
        idempotent: bool = False,
        timeout: float | None = None,
    ) -> AsyncIterator[httpx.Response]:
        """Send a request and yield the response with its body unread (2xx only).

        Error answers are read and raised as their ``OrchardError`` subclass; retries follow
        the module's policy. ``timeout`` raises the per-request timeout for long waits.
        """
        request_id = new_request_id()
        attempt = 0
        while True:
            request = self._build(method, path, request_id, json, params, content, timeout)
            try:
                response = await self._client.send(request, stream=True)
            except httpx.TransportError as exc:
                if idempotent and attempt < self.retry.max_retries:
                    await _sleep(self.retry.delay(attempt, None))
                    attempt += 1
                    continue
                raise ConnectionFailed(
                    f"{method} {path}: {type(exc).__name__}: {exc}", request_id=request_id
                ) from exc
            if response.status_code < 400:
                break
            try:
                await response.aread()
            finally:
                await response.aclose()
            error = error_from_response(response, request_id)
            if isinstance(error, Overloaded) and idempotent and attempt < self.retry.max_retries:
                await _sleep(self.retry.delay(attempt, error.retry_after))
                attempt += 1
                continue
            raise error
        try:
            yield response
        finally:
            await response.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | list[tuple[str, Any]] | None = None,
        content: Content = None,
        idempotent: bool = False,
        timeout: float | None = None,
    ) -> httpx.Response:
        """Send a request and return the fully read 2xx response (see ``stream``)."""
        async with self.stream(
            method,
            path,
            json=json,
            params=params,
            content=content,
            idempotent=idempotent,
            timeout=timeout,
        ) as response:
            try:
                await response.aread()
            except httpx.TransportError as exc:
                raise ConnectionFailed(f"{method} {path}: {exc}") from exc
            return response

    async def send_any(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | list[tuple[str, Any]] | None = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_bytes: int | None = None,
    ) -> httpx.Response:
        """Send once and return the read response whatever its status (for forwarded
        requests, whose error answers belong to someone else). A body longer than
        ``max_bytes`` raises ``PayloadTooLarge`` without being read whole; transport errors
        raise ``ConnectionFailed``."""
        request_id = new_request_id()
        request = self._build(method, path, request_id, json, params, content, timeout)
        for name, value in (headers or {}).items():
            request.headers[name] = value
        try:
            response = await self._client.send(request, stream=True)
            try:
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if max_bytes is not None and len(body) > max_bytes:
                        raise PayloadTooLarge(
                            f"{method} {path}: the answer exceeds {max_bytes} bytes",
                            status=413,
                            request_id=request_id,
                        )
            finally:
                await response.aclose()
        except httpx.TransportError as exc:
            raise ConnectionFailed(
                f"{method} {path}: {type(exc).__name__}: {exc}", request_id=request_id
            ) from exc
        kept = [  # the body is decoded already
            (k, v)
            for k, v in response.headers.multi_items()
            if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
        ]
        return httpx.Response(
            response.status_code, headers=kept, content=bytes(body), request=request
        )

    async def json(self, method: str, path: str, **kw: Any) -> Any:
        """``request`` and decode the JSON body."""
        return (await self.request(method, path, **kw)).json()

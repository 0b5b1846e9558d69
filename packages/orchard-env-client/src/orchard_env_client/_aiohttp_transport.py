"""An httpx transport over aiohttp's connection pool (used when aiohttp is installed).

The SDK speaks httpx everywhere; only the bottom layer changes. httpx's own pool
(httpcore over anyio, a pure-Python HTTP/1.1 parser) costs ~1.4 ms of CPU per request
here; aiohttp's C parser on plain asyncio streams ~0.7 ms including httpx's request and
response objects above it (docs/performance.md). Every aiohttp failure is raised as the
httpx exception the default transport would raise, so retries and errors do not change.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import yarl

# Set by httpx itself; aiohttp decides framing from the body it is given.
_DROPPED = {b"transfer-encoding", b"connection", b"keep-alive"}
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def wanted() -> bool:
    """Whether the SDK should use this transport by default.

    Not when ``ORCHARD_ENV_CLIENT_TRANSPORT=httpx`` asks for plain httpx, and not when a
    proxy is configured in the environment (httpx honours those variables only with its
    own transport, and a proxied setup should keep working as it did).
    """
    if os.environ.get("ORCHARD_ENV_CLIENT_TRANSPORT", "").lower() == "httpx":
        return False
    return not any(os.environ.get(name) for name in _PROXY_VARS)


def _timeout(request: httpx.Request) -> aiohttp.ClientTimeout:
    spec: dict[str, float | None] = request.extensions.get("timeout", {})
    return aiohttp.ClientTimeout(
        total=None,
        connect=spec.get("pool"),  # aiohttp's `connect` includes waiting for a pooled slot
        sock_connect=spec.get("connect"),
        sock_read=spec.get("read"),
    )


def _translate(
    exc: BaseException, request: httpx.Request, *, reading: bool
) -> httpx.TransportError:
    """The httpx exception the default transport raises for the same failure."""
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message, request=request)
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout(message, request=request)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message, request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(message, request=request)
    if reading:
        return httpx.ReadError(message, request=request)
    return httpx.WriteError(message, request=request)


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _translate(exc, self._request, reading=True) from exc

    async def aclose(self) -> None:
        self._response.release()


async def _request_body(stream: httpx.AsyncByteStream) -> AsyncIterator[bytes]:
    async for chunk in stream:
        yield chunk


class AiohttpTransport(httpx.AsyncBaseTransport):
    """Send httpx requests with aiohttp; responses stream back as httpx responses.

    One aiohttp session (made on first use, in the running loop) holds up to ``limit``
    connections. Cookies, redirects and decompression stay httpx's business.
    """

    def __init__(self, limit: int = 100) -> None:
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit),
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send one request; the answer's body is read as the caller iterates it."""
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in request.headers.raw
            if k.lower() not in _DROPPED
        ]
        data: Any
        if isinstance(request.stream, httpx.ByteStream):
            data = await request.aread() or None
        else:
            data = _request_body(request.stream)  # type: ignore[arg-type]
        try:
            response = await self._session_now().request(
                request.method,
                yarl.URL(str(request.url), encoded=True),  # as httpx encoded it
                headers=headers,
                data=data,
                timeout=_timeout(request),
                allow_redirects=False,
                compress=None,
            )
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _translate(exc, request, reading=False) from exc
        return httpx.Response(
            response.status,
            headers=[(k, v) for k, v in response.raw_headers],
            stream=_ResponseStream(response, request),
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": (response.reason or "").encode("latin-1"),
            },
        )

    async def aclose(self) -> None:
        """Close the pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

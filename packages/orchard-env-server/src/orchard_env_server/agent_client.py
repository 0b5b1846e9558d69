"""Pooled HTTP connections from the orchestrator to sandbox agents."""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx

from .errors import ApiError, backend_unavailable
from .records import AgentEndpoint

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
}


class AgentUnreachable(ApiError):
    """The agent did not answer: the sandbox is probably gone."""

    def __init__(self, detail: str) -> None:
        super().__init__(502, "agent_unreachable", detail)


def forwardable_headers(headers: httpx.Headers | Any) -> dict[str, str]:
    """Response headers worth passing back to a client."""
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}


async def stream_body(response: httpx.Response) -> AsyncIterator[bytes]:
    """Relay a streamed agent answer chunk by chunk, closing it however the relay ends."""
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    finally:
        await response.aclose()


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


def unix_transport(path: str, max_connections: int = 100) -> httpx.AsyncHTTPTransport:
    """A transport over one unix socket (see ``_transport``)."""
    return _transport(path, max_connections)


def _transport(uds: str | None, max_connections: int) -> httpx.AsyncHTTPTransport:
    """Over TCP, or a unix socket. No TLS is spoken to agents, but httpx builds a TLS
    context per transport (CA certificates loaded: ~20 ms of CPU each); share one. The
    limits go on the transport: httpx ignores a client's own once a transport is given."""
    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections
    )
    return httpx.AsyncHTTPTransport(uds=uds, verify=_tls_context(), limits=limits)


# A dead agent refuses connections at once; a busy one (a thousand sandboxes' requests
# arriving together) may take seconds to accept: give it time rather than fail the command.
_CONNECT_S = 30.0


def _pool(max_connections: int, uds: str | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=_transport(uds, max_connections),
        timeout=httpx.Timeout(30.0, connect=_CONNECT_S),
        trust_env=False,
    )


def _pool_key(endpoint: AgentEndpoint) -> str:
    return endpoint.uds or f"{endpoint.base_url}#{endpoint.sandbox_header or ''}"


class AgentClient:
    """Keep-alive connections to sandbox agents: one small pool per sandbox.

    One pool per sandbox, not one shared pool: httpcore's pool scans every connection and
    queued request each time a request starts or ends, so one pool carrying a thousand
    sandboxes' traffic costs milliseconds of CPU per request; a sandbox's own pool holds
    the few connections of its own concurrent requests.
    """

    def __init__(self, per_sandbox: int = 64) -> None:
        self._per_sandbox = per_sandbox
        self._pools: dict[str, httpx.AsyncClient] = {}

    def _http_for(self, endpoint: AgentEndpoint) -> httpx.AsyncClient:
        key = _pool_key(endpoint)
        client = self._pools.get(key)
        if client is None:
            client = self._pools[key] = _pool(self._per_sandbox, endpoint.uds)
        return client

    async def forget(self, endpoint: AgentEndpoint | None) -> None:
        """Close the connections of a sandbox that is gone."""
        if endpoint is not None:
            client = self._pools.pop(_pool_key(endpoint), None)
            if client is not None:
                await client.aclose()

    async def aclose(self) -> None:
        for client in self._pools.values():
            await client.aclose()
        self._pools.clear()

    def _raise_for(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        try:
            body = response.json()
            detail, code = str(body["detail"]), str(body.get("code", "agent_error"))
        except Exception:
            detail, code = response.text[:500] or response.reason_phrase, "agent_error"
        if response.status_code == 401:
            # The orchestrator holds the token; a 401 means the agent is not ours any more.
            raise backend_unavailable(f"sandbox agent rejected the orchestrator: {detail}")
        raise ApiError(response.status_code, code, detail)

    async def request(
        self,
        endpoint: AgentEndpoint,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | list[tuple[str, Any]] | None = None,
        timeout: float | None = 30.0,
        request_id: str | None = None,
    ) -> Any:
        """Send one request and return the decoded JSON answer, or raise ApiError."""
        headers = endpoint.headers()
        if request_id:
            headers["X-Request-ID"] = request_id
        try:
            response = await self._http_for(endpoint).request(
                method,
                endpoint.base_url + path,
                json=json,
                params=params,
                headers=headers,
                timeout=httpx.Timeout(timeout, connect=_CONNECT_S),
            )
        except httpx.TimeoutException as exc:
            raise ApiError(
                504, "agent_timeout", f"sandbox agent did not answer in time: {exc!r}"
            ) from exc
        except httpx.TransportError as exc:
            raise AgentUnreachable(f"sandbox agent unreachable: {exc!r}") from exc
        self._raise_for(response)
        return response.json()

    async def open_stream(
        self,
        endpoint: AgentEndpoint,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | list[tuple[str, Any]] | None = None,
        json: Any = None,
        content: AsyncIterator[bytes] | bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        passthrough_errors: bool = False,
    ) -> httpx.Response:
        """Start a request whose answer is streamed; the caller must ``aclose()`` it.

        Agent errors become ApiError, except with ``passthrough_errors`` (forwarded ports),
        where only the agent's own ``port_not_listening`` is raised and any other answer is
        the sandboxed service's and passes through untouched.
        """
        all_headers = {**(headers or {}), **endpoint.headers()}
        http = self._http_for(endpoint)
        request = http.build_request(
            method,
            endpoint.base_url + path,
            params=params,
            json=json,
            content=content,
            headers=all_headers,
            timeout=httpx.Timeout(timeout, connect=_CONNECT_S),
        )
        try:
            response = await http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise AgentUnreachable(f"sandbox agent unreachable: {exc!r}") from exc
        forwarded = passthrough_errors and response.status_code != 502
        if response.status_code >= 400 and not forwarded:
            await response.aread()
            await response.aclose()
            self._raise_for(response)
        return response

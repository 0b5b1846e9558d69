"""Pooled HTTP connections from the orchestrator to sandbox agents.

Every exec, job and file call crosses this hop, so it runs on aiohttp: its C parser and
plain asyncio streams cost ~0.3 ms of CPU per request where httpx (pure-Python httpcore
over anyio) cost ~1.3 ms (measured in docs/performance.md).
"""

from __future__ import annotations

import json as jsonlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import attrs
import yarl

from .errors import ApiError, backend_unavailable
from .records import AgentEndpoint
from .unix_sockets import PinnedUnixConnector

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

# A dead agent refuses connections at once; a busy one (a thousand sandboxes' requests
# arriving together) may take seconds to accept: give it time rather than fail the command.
_CONNECT_S = 30.0
# Headers of a service behind a forwarded port may be long (cookies, tokens).
_MAX_HEADER_BYTES = 65536
Query = Mapping[str, Any] | list[tuple[str, Any]] | None


class AgentUnreachable(ApiError):
    """The agent did not answer: the sandbox is probably gone."""

    def __init__(self, detail: str) -> None:
        super().__init__(502, "agent_unreachable", detail)


def forwardable_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Response headers worth passing back to a client."""
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}


@attrs.define
class AgentStream:
    """An agent answer whose body is still to be read; ``aclose()`` it when done."""

    status_code: int
    headers: Mapping[str, str]
    _response: aiohttp.ClientResponse
    _body: bytes | None = None

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body as it arrives, undecoded; a broken connection is AgentUnreachable."""
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except aiohttp.ClientError as exc:
            raise AgentUnreachable(f"sandbox agent went away mid-answer: {exc!r}") from exc

    async def aread(self) -> bytes:
        """The whole body (read once)."""
        if self._body is None:
            self._body = b"".join([chunk async for chunk in self.aiter_raw()])
        return self._body

    def json(self) -> Any:
        """The body, read with ``aread()`` first, as JSON."""
        assert self._body is not None, "aread() first"
        return jsonlib.loads(self._body)

    async def aclose(self) -> None:
        """Give the connection back (or drop it when the body was not read to the end)."""
        self._response.release()


async def stream_body(response: AgentStream) -> AsyncIterator[bytes]:
    """Relay a streamed agent answer chunk by chunk, closing it however the relay ends."""
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    finally:
        await response.aclose()


# Streams (forwarded ports, files) pass the caller's headers through: none of aiohttp's
# own. Set per stream, not on the session: a session-wide skip list is rebuilt per request.
_PASSTHROUGH_SKIPPED = ("User-Agent", "Accept-Encoding")


def _session(per_agent: int, uds: str | None) -> aiohttp.ClientSession:
    connector: aiohttp.BaseConnector
    if uds:
        connector = PinnedUnixConnector(path=uds, limit=per_agent)
    else:
        connector = aiohttp.TCPConnector(limit=per_agent, use_dns_cache=False)
    return aiohttp.ClientSession(
        connector=connector,
        # Forwarded ports pass bytes and headers through untouched: no cookie memory
        # shared between requests, no decompression (and, per stream, no headers the
        # caller did not send).
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        max_line_size=_MAX_HEADER_BYTES,
        max_field_size=_MAX_HEADER_BYTES,
    )


def _pool_key(endpoint: AgentEndpoint) -> str:
    return endpoint.uds or endpoint.base_url


def _shared(endpoint: AgentEndpoint) -> bool:
    """Whether the agent serves many sandboxes (it selects one by header)."""
    return endpoint.sandbox_header is not None


def _query(params: Query) -> list[tuple[str, str]] | None:
    """Query parameters as strings, booleans spelled as JSON does (``true``)."""
    if params is None:
        return None
    items = params.items() if isinstance(params, Mapping) else params
    return [(k, ("true" if v else "false") if isinstance(v, bool) else str(v)) for k, v in items]


def _timeout(seconds: float | None) -> aiohttp.ClientTimeout:
    # `seconds` bounds each wait for the agent's bytes, as a read timeout: a long command
    # streaming output is not cut off. Waiting for a free pooled connection is not bounded
    # here: the service's own in-flight limit (`svc.slot()`) bounds the queue.
    return aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_S, sock_read=seconds)


def _decode_error(status: int, reason: str | None, body: bytes) -> ApiError:
    try:
        data = jsonlib.loads(body)
        detail, code = str(data["detail"]), str(data.get("code", "agent_error"))
    except Exception:
        detail, code = body[:500].decode(errors="replace") or (reason or ""), "agent_error"
    if status == 401:
        # The orchestrator holds the token; a 401 means the agent is not ours any more.
        return backend_unavailable(f"sandbox agent rejected the orchestrator: {detail}")
    return ApiError(status, code, detail)


def _transport_error(exc: BaseException) -> ApiError:
    if isinstance(exc, TimeoutError):  # aiohttp's timeouts subclass it
        return ApiError(504, "agent_timeout", f"sandbox agent did not answer in time: {exc!r}")
    return AgentUnreachable(f"sandbox agent unreachable: {exc!r}")


class AgentClient:
    """Keep-alive connections to sandbox agents: one small pool per agent.

    An agent of its own per sandbox (Docker, Kubernetes) gets a pool of its own, holding
    the few connections of that sandbox's concurrent requests; closing it when the sandbox
    goes drops exactly its connections. A multi-sandbox agent (the local backend's) gets
    one pool for all its sandboxes, so its connections number the requests in flight, not
    the sandboxes alive: a pool per sandbox cost ~5 KiB each plus an idle connection on
    both sides until its keep-alive expired.
    """

    def __init__(self, per_agent: int = 0) -> None:
        """``per_agent`` caps each agent's pool, a shared agent's across all its sandboxes
        (0: no cap; long streams then never starve short calls, and the service's
        in-flight limit still applies)."""
        self._per_agent = per_agent
        self._pools: dict[str, aiohttp.ClientSession] = {}

    def _http_for(self, endpoint: AgentEndpoint) -> aiohttp.ClientSession:
        key = _pool_key(endpoint)
        session = self._pools.get(key)
        if session is None:
            session = self._pools[key] = _session(self._per_agent, endpoint.uds)
        return session

    async def forget(self, endpoint: AgentEndpoint | None) -> None:
        """Close the connections of a sandbox that is gone (a shared agent's pool stays:
        its other sandboxes use it)."""
        if endpoint is not None and not _shared(endpoint):
            session = self._pools.pop(_pool_key(endpoint), None)
            if session is not None:
                await session.close()

    async def aclose(self) -> None:
        """Close every pool."""
        pools, self._pools = list(self._pools.values()), {}
        for session in pools:
            await session.close()

    async def request(
        self,
        endpoint: AgentEndpoint,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Query = None,
        timeout: float | None = 30.0,
        request_id: str | None = None,
    ) -> Any:
        """Send one request and return the decoded JSON answer, or raise ApiError."""
        headers = endpoint.headers()
        headers["Accept-Encoding"] = "identity"  # set, not skipped: skipping costs per call
        if request_id:
            headers["X-Request-ID"] = request_id
        try:
            async with self._http_for(endpoint).request(
                method,
                yarl.URL(endpoint.base_url + path, encoded=True),
                json=json,
                params=_query(params),
                headers=headers,
                timeout=_timeout(timeout),
                allow_redirects=False,
            ) as response:
                body = await response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _transport_error(exc) from exc
        if response.status >= 400:
            raise _decode_error(response.status, response.reason, body)
        return jsonlib.loads(body)

    async def open_stream(
        self,
        endpoint: AgentEndpoint,
        method: str,
        path: str,
        *,
        params: Query = None,
        json: Any = None,
        content: AsyncIterator[bytes] | bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        passthrough_errors: bool = False,
    ) -> AgentStream:
        """Start a request whose answer is streamed; the caller must ``aclose()`` it.

        ``path`` is sent as given (already percent-encoded). Agent errors become ApiError,
        except with ``passthrough_errors`` (forwarded ports), where only the agent's own
        ``port_not_listening`` is raised and any other answer is the sandboxed service's
        and passes through untouched.
        """
        all_headers = {**(headers or {}), **endpoint.headers()}
        try:
            response = await self._http_for(endpoint).request(
                method,
                yarl.URL(endpoint.base_url + path, encoded=True),
                params=_query(params),
                json=json,
                data=content,
                headers=all_headers,
                skip_auto_headers=_PASSTHROUGH_SKIPPED,
                timeout=_timeout(timeout),
                allow_redirects=False,
            )
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _transport_error(exc) from exc
        stream = AgentStream(response.status, response.headers, response)
        forwarded = passthrough_errors and response.status != 502
        if response.status >= 400 and not forwarded:
            try:
                body = await stream.aread()
            finally:
                await stream.aclose()
            raise _decode_error(response.status, response.reason, body)
        return stream

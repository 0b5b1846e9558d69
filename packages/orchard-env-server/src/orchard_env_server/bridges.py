"""Service bridges, the orchestrator's half: checking them, and relaying their requests.

``bridges: {"<sandbox port>": "<upstream URL>"}`` at create makes
``http://127.0.0.1:<port>/<path>?<q>`` inside the sandbox reach ``<upstream>/<path>?<q>``.
The sandbox cannot reach the orchestrator, so the orchestrator calls in: once the sandbox
is ready it tells the agent which ports to listen on (``POST /bridges``), then keeps a few
long polls open (``GET /bridges/next``). Each poll returns one request read inside the
sandbox; the orchestrator sends it upstream with httpx and streams the answer back to the
agent (``POST /bridges/{id}/response``, status and headers in that request's headers),
chunk by chunk, so server-sent events arrive as the upstream sends them. See the agent's
``orchard_env_agent.bridges`` for the other half.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import urllib.parse
from collections.abc import AsyncIterator, Collection, Iterable, Mapping
from typing import Any

import httpx

from orchard_env_agent.bridges import (
    ANSWER_WITHIN_S,
    HEADER_HEADERS,
    HEADER_REQUEST,
    HEADER_STATUS,
)
from orchard_env_agent.ports import RFC_HOP_BY_HOP

from .agent_client import AgentClient, AgentStream
from .errors import ApiError, bad_request
from .records import SandboxRecord
from .settings import Settings

log = logging.getLogger("orchard_env_server")

MAX_BRIDGES = 16
POLLS_PER_SANDBOX = 2  # long polls kept open per sandbox: one may be handing a request over
POLL_WAIT_S = 30.0
# Requests of one sandbox being forwarded at once; its polls wait for a free slot, so the
# bodies the orchestrator holds (each at most the request cap) are bounded per sandbox.
MAX_FORWARDS_PER_SANDBOX = 32
_RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # after a failed poll: the agent restarting, say
_MAX_URL = 2048


def _invalid(detail: str) -> ApiError:
    return bad_request(detail, "invalid_bridge")


def _check_upstream(port: str, url: str) -> None:
    if len(url) > _MAX_URL:
        raise _invalid(f"bridge {port}: the upstream URL is longer than {_MAX_URL} characters")
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:  # "http://[::1", fullwidth "/" or "@" in the host, ...
        raise _invalid(f"bridge {port}: upstream {url[:100]!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _invalid(f"bridge {port}: upstream {url!r} is not an http or https URL")
    if parts.username is not None or parts.password is not None:
        raise _invalid(f"bridge {port}: the upstream URL must not carry credentials")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise _invalid(f"bridge {port}: the upstream URL must have no query or fragment")
    if _has_dot_segment(parts.path):
        raise _invalid(f"bridge {port}: the upstream URL's path has . or .. segments")
    with contextlib.suppress(ValueError):
        parts.port  # noqa: B018 - raises on a bad port
        return
    raise _invalid(f"bridge {port}: upstream {url!r} has an invalid port")


def _within(url: str, prefix: str) -> bool:
    """Whether ``url`` is under the allowed ``prefix``: same scheme and host:port, and a
    path below the prefix's at a segment boundary (``/v1`` allows ``/v1/x``, not ``/v10``)."""
    u, p = urllib.parse.urlsplit(url), urllib.parse.urlsplit(prefix)
    if (u.scheme, u.netloc.lower()) != (p.scheme, p.netloc.lower()):
        return False
    base = p.path.rstrip("/")
    return not base or u.path == base or u.path.startswith(base + "/")


def validate_bridges(
    raw: Mapping[str, str] | None, allowed: Collection[str], reserved: Collection[int]
) -> dict[str, str]:
    """The create body's ``bridges``, checked (400 with a code saying what is wrong) and
    with ports spelled canonically (``"04000"`` is ``"4000"``)."""
    if not raw:
        return {}
    if len(raw) > MAX_BRIDGES:
        raise _invalid(f"{len(raw)} bridges asked for; at most {MAX_BRIDGES}")
    out: dict[str, str] = {}
    for key, url in raw.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 5 and 1 <= int(key) <= 65535):
            raise _invalid(f"bridge port {key[:20]!r} is not a port number (1..65535)")
        port = int(key)
        if port in reserved:
            raise bad_request(
                f"bridge port {port} is the sandbox agent's own on this backend",
                "bridge_port_reserved",
            )
        _check_upstream(key, url)
        if allowed and not any(_within(url, prefix) for prefix in allowed):
            raise bad_request(
                f"bridge {port}: upstream {url!r} is not under any URL this server allows "
                f"({', '.join(sorted(allowed))})",
                "bridge_upstream_not_allowed",
            )
        if str(port) in out:
            raise _invalid(f"bridge port {port} is given twice")
        out[str(port)] = url
    return out


def _has_dot_segment(path: str) -> bool:
    """Whether the path climbs, however spelled: ``..``, ``%2e%2e``, and also once decoded
    as an upstream may (``..%2f``, ``..\\``), so the upstream's path prefix is not left."""
    for _ in range(3):  # and decoded again (%252e%252e), as some upstreams do
        if any(seg in (".", "..") for seg in path.replace("\\", "/").split("/")):
            return True
        path, before = urllib.parse.unquote(path), path
        if path == before:
            return False
    return True  # still encoded after three rounds: not a path worth relaying


def upstream_url(upstream: str, target: str) -> str:
    """Where a request for ``target`` (``/path?query`` as sent in the sandbox) goes: the
    upstream's path prefix, then the request's path, the query kept as it came.
    ValueError when the target is not a plain path or climbs with dot segments."""
    if not target.startswith("/"):
        raise ValueError(f"request target {target[:100]!r} is not a path (origin form)")
    path, sep, query = target.partition("?")
    path = path.partition("#")[0]
    if _has_dot_segment(path):
        raise ValueError("request paths with . or .. segments are refused")
    return upstream.rstrip("/") + path + (sep + query if query else "")


def _end_to_end(pairs: Iterable[tuple[str, str]], drop: set[str]) -> list[tuple[str, str]]:
    pairs = list(pairs)
    named = {
        token.strip().lower()
        for name, value in pairs
        if name.lower() == "connection"
        for token in value.split(",")
    }
    return [(k, v) for k, v in pairs if k.lower() not in RFC_HOP_BY_HOP | named | drop]


class BridgeRelay:
    """Per sandbox with bridges, a task keeping long polls open to its agent and a task
    per request forwarding it upstream (at most ``MAX_FORWARDS_PER_SANDBOX`` at once)."""

    def __init__(self, agents: AgentClient, settings: Settings) -> None:
        self._agents = agents
        self._settings = settings
        self._relays: dict[str, asyncio.Task[None]] = {}
        self._forwards: dict[str, set[asyncio.Task[None]]] = {}  # by sandbox
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=15.0, read=None, write=60.0, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            trust_env=False,
            follow_redirects=False,
        )

    async def configure(self, record: SandboxRecord) -> None:
        """Have the agent listen on the record's bridge ports (idempotent); ApiError if
        it cannot (a port in use in the sandbox, say)."""
        assert record.agent is not None
        body = {
            "ports": sorted(int(p) for p in record.bridges),
            "max_request_bytes": self._settings.bridge_max_request_bytes,
        }
        await self._agents.request(record.agent, "POST", "/bridges", json=body)

    def start(self, record: SandboxRecord) -> None:
        """Relay the sandbox's bridges from now on (once ready, if it is not yet)."""
        sandbox_id = record.sandbox_id
        if record.bridges and sandbox_id not in self._relays:
            task = asyncio.create_task(self._relay(record), name=f"bridges-{sandbox_id}")
            self._relays[sandbox_id] = task
            task.add_done_callback(functools.partial(self._ended, sandbox_id))

    def _ended(self, sandbox_id: str, task: asyncio.Task[None]) -> None:
        if self._relays.get(sandbox_id) is task:
            del self._relays[sandbox_id]

    def stop(self, sandbox_id: str) -> None:
        """Stop polling for the sandbox and forwarding its requests (it is being deleted):
        an upstream still answering, or never answering, holds nothing any longer."""
        task = self._relays.pop(sandbox_id, None)
        if task is not None:
            task.cancel()
        for forward in self._forwards.pop(sandbox_id, set()):
            forward.cancel()

    def in_flight(self, sandbox_id: str) -> int:
        """How many of the sandbox's requests are being forwarded now."""
        return len(self._forwards.get(sandbox_id, ()))

    async def close(self) -> None:
        """Stop every relay and forward (the orchestrator is stopping)."""
        tasks = [*self._relays.values(), *(t for ts in self._forwards.values() for t in ts)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._relays.clear()
        self._forwards.clear()
        await self._http.aclose()

    # -- polling ------------------------------------------------------------------------
    async def _relay(self, record: SandboxRecord) -> None:
        await record.settled.wait()  # a sandbox found again may still be starting
        if record.status != "ready":
            return
        # A sandbox found again after a restart may have an agent that restarted too,
        # without its listeners, while the polls themselves would succeed: listen first.
        with contextlib.suppress(ApiError):
            await self.configure(record)
        slots = asyncio.Semaphore(MAX_FORWARDS_PER_SANDBOX)
        await asyncio.gather(*(self._poll(record, slots) for _ in range(POLLS_PER_SANDBOX)))

    async def _poll(self, record: SandboxRecord, slots: asyncio.Semaphore) -> None:
        failures = 0
        while record.status == "ready" and record.agent is not None:
            await slots.acquire()  # released when the request taken is answered
            handed_over = False
            try:
                if failures:  # the agent may have restarted without its listeners
                    await self.configure(record)
                handed_over = await self._take_one(record, slots)
                failures = 0
                continue
            except Exception as exc:  # any failure is retried: the relay must not end
                detail = exc.detail if isinstance(exc, ApiError) else repr(exc)
                if failures == 0 or failures % 20 == 0:
                    log.warning("bridges of %s: %s", record.sandbox_id, detail)
            finally:
                if not handed_over:
                    slots.release()
            await asyncio.sleep(_RETRY_S[min(failures, len(_RETRY_S) - 1)])
            failures += 1

    async def _take_one(self, record: SandboxRecord, slots: asyncio.Semaphore) -> bool:
        """Wait for one request and start forwarding it; False when none came."""
        assert record.agent is not None
        stream = await self._agents.open_stream(
            record.agent,
            "GET",
            "/bridges/next",
            params={"wait": POLL_WAIT_S},
            timeout=POLL_WAIT_S + 30,
        )
        try:
            if stream.status_code == 204:
                return False
            meta = json.loads(stream.headers[HEADER_REQUEST])
            if not isinstance(meta, dict) or "id" not in meta:
                raise ValueError(f"the agent handed over no request: {meta!r:.200}")
            body = await _read_at_most(stream, self._settings.bridge_max_request_bytes)
        finally:
            await stream.aclose()
        task = asyncio.create_task(self._forward(record, meta, body))
        forwards = self._forwards.setdefault(record.sandbox_id, set())
        forwards.add(task)

        def done(_: asyncio.Task[None]) -> None:
            forwards.discard(task)
            slots.release()

        task.add_done_callback(done)
        return True

    # -- forwarding ----------------------------------------------------------------------
    async def _forward(
        self, record: SandboxRecord, meta: dict[str, Any], body: bytes | None
    ) -> None:
        request_id = str(meta["id"])
        upstream = record.bridges.get(str(meta.get("port")))
        if body is None:
            cap = self._settings.bridge_max_request_bytes
            detail = f"request body exceeds the bridge's {cap} bytes"
            await self._answer_error(record, request_id, 413, "too_large", detail)
            return
        try:
            if upstream is None:
                raise ValueError(f"port {meta.get('port')!r:.20} has no bridge")
            url = upstream_url(upstream, str(meta["target"]))
            pairs = [(str(k), str(v)) for k, v in meta["headers"]]
            headers = _end_to_end(pairs, {"host", "content-length", "expect"})
            request = httpx.Request(str(meta["method"]), url, headers=headers, content=body)
        except (ValueError, TypeError, KeyError, httpx.InvalidURL) as exc:
            await self._answer_error(record, request_id, 400, "bad_bridge_request", str(exc))
            return
        try:
            async with asyncio.timeout(ANSWER_WITHIN_S):
                response = await self._http.send(request, stream=True)
        except TimeoutError:
            detail = f"the bridge's upstream {upstream} did not answer in time"
            await self._answer_error(record, request_id, 504, "bridge_timeout", detail)
            return
        except httpx.HTTPError as exc:
            detail = f"the bridge's upstream {upstream} did not answer: {exc!r}"
            await self._answer_error(record, request_id, 502, "upstream_unreachable", detail)
            return
        _ack_promptly(response)
        try:
            raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw]
            answer = _end_to_end(raw, set())
            await self._answer(
                record, request_id, response.status_code, answer, response.aiter_raw()
            )
        except Exception as exc:  # the upstream or the agent broke off mid-answer
            log.info("bridge request of %s broke off: %r", record.sandbox_id, exc)
            # Refused before any of it was written (headers the agent could not take,
            # say): the caller is answered now rather than at the agent's 504. Once
            # written, the agent no longer knows the id and this is a no-op.
            detail = "the upstream's answer could not be relayed"
            await self._answer_error(record, request_id, 502, "bad_upstream_answer", detail)
        finally:
            await response.aclose()

    async def _answer_error(
        self, record: SandboxRecord, request_id: str, status: int, code: str, detail: str
    ) -> None:
        body = json.dumps({"detail": detail, "code": code}).encode()
        headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
        with contextlib.suppress(ApiError):
            await self._answer(record, request_id, status, headers, body)

    async def _answer(
        self,
        record: SandboxRecord,
        request_id: str,
        status: int,
        headers: list[tuple[str, str]],
        body: AsyncIterator[bytes] | bytes,
    ) -> None:
        if record.agent is None:
            return
        stream = await self._agents.open_stream(
            record.agent,
            "POST",
            f"/bridges/{urllib.parse.quote(request_id, safe='')}/response",
            content=body,
            headers={HEADER_STATUS: str(status), HEADER_HEADERS: json.dumps(headers)},
            timeout=None,
        )
        try:
            await stream.aread()
        finally:
            await stream.aclose()


def _ack_promptly(response: httpx.Response) -> None:
    """Have the kernel acknowledge the upstream's answer as it arrives, not 40 ms later.

    On a kept-alive connection Linux delays ACKs (request/response "pingpong" mode). An
    upstream that writes its head and body separately with Nagle on (Python's http.server
    does) then holds the body until the head is acknowledged: every bridged request took
    ~40 ms more than a direct one. TCP_QUICKACK sends the pending ACK now and leaves
    pingpong mode for the rest of this answer; the next request re-enters it, hence per
    answer. Linux only; elsewhere, or without a socket, nothing is done.
    """
    quickack: int | None = getattr(socket, "TCP_QUICKACK", None)
    stream = response.extensions.get("network_stream")
    # A socket.socket, or under uvloop (uvicorn's loop) a PseudoSocket: duck-typed.
    sock: Any = stream.get_extra_info("socket") if stream is not None else None
    if quickack is not None and hasattr(sock, "setsockopt"):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)


async def _read_at_most(stream: AgentStream, cap: int) -> bytes | None:
    """The poll's body (the request's), or None past ``cap`` bytes (what the agent caps
    already; an agent the sandbox tampered with cannot make the orchestrator hold more)."""
    body = bytearray()
    async for chunk in stream.aiter_raw():
        body += chunk
        if len(body) > cap:
            return None
    return bytes(body)

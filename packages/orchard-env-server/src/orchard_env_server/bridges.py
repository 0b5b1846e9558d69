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
import json
import logging
import urllib.parse
from collections.abc import AsyncIterator, Collection, Iterable, Mapping
from typing import Any

import httpx

from orchard_env_agent.bridges import HEADER_HEADERS, HEADER_REQUEST, HEADER_STATUS
from orchard_env_agent.ports import RFC_HOP_BY_HOP

from .agent_client import AgentClient
from .errors import ApiError, bad_request
from .records import SandboxRecord
from .settings import Settings

log = logging.getLogger("orchard_env_server")

MAX_BRIDGES = 16
POLLS_PER_SANDBOX = 2  # long polls kept open per sandbox: one may be handing a request over
POLL_WAIT_S = 30.0
_RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # after a failed poll: the agent restarting, say
_MAX_URL = 2048


def _invalid(detail: str) -> ApiError:
    return bad_request(detail, "invalid_bridge")


def _check_upstream(port: str, url: str) -> None:
    if len(url) > _MAX_URL:
        raise _invalid(f"bridge {port}: the upstream URL is longer than {_MAX_URL} characters")
    parts = urllib.parse.urlsplit(url)
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
        if not key.isascii() or not key.isdigit() or not 1 <= int(key) <= 65535:
            raise _invalid(f"bridge port {key!r} is not a port number (1..65535)")
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
    return any(urllib.parse.unquote(seg) in (".", "..") for seg in path.split("/"))


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
    per request forwarding it upstream."""

    def __init__(self, agents: AgentClient, settings: Settings) -> None:
        self._agents = agents
        self._settings = settings
        self._relays: dict[str, asyncio.Task[None]] = {}
        self._forwards: set[asyncio.Task[None]] = set()
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
        if record.bridges and record.sandbox_id not in self._relays:
            task = asyncio.create_task(self._relay(record), name=f"bridges-{record.sandbox_id}")
            self._relays[record.sandbox_id] = task
            task.add_done_callback(lambda _: self._relays.pop(record.sandbox_id, None))

    def stop(self, sandbox_id: str) -> None:
        """Stop polling for the sandbox (it is being deleted)."""
        task = self._relays.pop(sandbox_id, None)
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        tasks = [*self._relays.values(), *self._forwards]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._relays.clear()
        await self._http.aclose()

    # -- polling ------------------------------------------------------------------------
    async def _relay(self, record: SandboxRecord) -> None:
        await record.settled.wait()  # a sandbox found again may still be starting
        if record.status == "ready":
            await asyncio.gather(*(self._poll(record, i) for i in range(POLLS_PER_SANDBOX)))

    async def _poll(self, record: SandboxRecord, index: int) -> None:
        failures = 0
        while record.status == "ready" and record.agent is not None:
            try:
                if failures:  # the agent may have restarted without its listeners
                    await self.configure(record)
                await self._take_one(record)
                failures = 0
            except ApiError as exc:
                if failures == 0 or failures % 20 == 0:
                    log.warning("bridges of %s: %s", record.sandbox_id, exc.detail)
                await asyncio.sleep(_RETRY_S[min(failures, len(_RETRY_S) - 1)])
                failures += 1

    async def _take_one(self, record: SandboxRecord) -> None:
        assert record.agent is not None
        endpoint = record.agent
        stream = await self._agents.open_stream(
            endpoint,
            "GET",
            "/bridges/next",
            params={"wait": POLL_WAIT_S},
            timeout=POLL_WAIT_S + 30,
        )
        try:
            if stream.status_code == 204:
                return
            meta = json.loads(stream.headers[HEADER_REQUEST])
            body = await stream.aread()
        finally:
            await stream.aclose()
        task = asyncio.create_task(self._forward(record, meta, body))
        self._forwards.add(task)
        task.add_done_callback(self._forwards.discard)

    # -- forwarding ----------------------------------------------------------------------
    async def _forward(self, record: SandboxRecord, meta: dict[str, Any], body: bytes) -> None:
        request_id = str(meta["id"])
        upstream = record.bridges.get(str(meta["port"]))
        try:
            if upstream is None:
                raise ValueError(f"port {meta['port']} has no bridge")
            url = upstream_url(upstream, str(meta["target"]))
            headers = _end_to_end(meta["headers"], {"host", "content-length", "expect"})
            request = httpx.Request(str(meta["method"]), url, headers=headers, content=body)
        except (ValueError, httpx.InvalidURL) as exc:
            await self._answer_error(record, request_id, 400, "bad_bridge_request", str(exc))
            return
        try:
            response = await self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            detail = f"the bridge's upstream {upstream} did not answer: {exc!r}"
            await self._answer_error(record, request_id, 502, "upstream_unreachable", detail)
            return
        try:
            answer = _end_to_end(response.headers.multi_items(), set())
            await self._answer(
                record, request_id, response.status_code, answer, response.aiter_raw()
            )
        except Exception as exc:  # the upstream or the agent broke off mid-answer
            log.info("bridge request of %s broke off: %r", record.sandbox_id, exc)
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
        await stream.aread()
        await stream.aclose()

"""Service bridges' pure rules: what a create may ask for, and where a request goes."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Collection
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchard_env_agent.bridges import HEADER_HEADERS, HEADER_REQUEST, HEADER_STATUS
from orchard_env_server.bridges import (
    MAX_FORWARDS_PER_SANDBOX,
    BridgeRelay,
    _ack_promptly,
    upstream_url,
    validate_bridges,
)
from orchard_env_server.errors import ApiError
from orchard_env_server.records import AgentEndpoint, SandboxRecord
from orchard_env_server.schemas import CreateSandboxRequest
from orchard_env_server.settings import Settings


def _code(
    raw: dict[str, str], allowed: Collection[str] = (), reserved: Collection[int] = ()
) -> str:
    with pytest.raises(ApiError) as caught:
        validate_bridges(raw, allowed, reserved)
    assert caught.value.status == 400
    return caught.value.code


def test_ports_are_spelled_canonically_and_urls_kept():
    got = validate_bridges({"04000": "https://api.example/v1/"}, [], set())
    assert got == {"4000": "https://api.example/v1/"}


@pytest.mark.parametrize(
    "raw",
    [
        {"0": "http://h"},
        {"65536": "http://h"},
        {"+80": "http://h"},
        {"\uff18\uff10": "http://h"},  # fullwidth digits
        {"80": "file:///etc/passwd"},
        {"80": "http://"},
        {"80": "http://h:99999/"},
        {"80": "http://h/v1/../admin"},
        {"80": "http://h/#frag"},
        {"80": "http://h/" + "a" * 2048},
        {"80": "http://h", "080": "http://h"},
    ],
)
def test_malformed_bridges_are_invalid(raw):
    assert _code(raw) == "invalid_bridge"


def test_reserved_ports_and_disallowed_upstreams_have_codes_of_their_own():
    assert _code({"7000": "http://h"}, reserved={7000}) == "bridge_port_reserved"
    allowed = ["http://models:8080/v1"]
    assert validate_bridges({"1": "http://models:8080/v1/chat"}, allowed, set())
    assert validate_bridges({"1": "http://MODELS:8080/v1"}, allowed, set())
    for url in (
        "http://models:8080/v10",
        "https://models:8080/v1",
        "http://models:8081/v1",
        "http://models/v1",
        "http://models:8080/",
    ):
        assert _code({"1": url}, allowed) == "bridge_upstream_not_allowed", url


@pytest.mark.parametrize(
    ("upstream", "target", "url"),
    [
        ("http://h:1/v1", "/chat?x=1&y=%20", "http://h:1/v1/chat?x=1&y=%20"),
        ("http://h:1/v1/", "/chat", "http://h:1/v1/chat"),
        ("http://h:1", "/", "http://h:1/"),
        ("http://h:1/v1", "/a%2Fb", "http://h:1/v1/a%2Fb"),
    ],
)
def test_a_request_goes_under_the_upstreams_path(upstream, target, url):
    assert upstream_url(upstream, target) == url


@pytest.mark.parametrize("target", ["/../x", "/a/%2e%2E/b", "/.", "*", "http://other/x"])
def test_targets_that_climb_or_go_elsewhere_are_refused(target):
    with pytest.raises(ValueError):
        upstream_url("http://h/v1", target)


# -- review findings ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw",
    [
        {"80": "http://[::1"},  # urlsplit: Invalid IPv6 URL
        {"80": "http://h\uff0f@x/"},  # urlsplit: invalid under NFKC
        {"1" * 5000: "http://h"},  # int(): more digits than Python converts
    ],
)
def test_urls_and_ports_python_cannot_parse_are_invalid_not_a_crash(raw):
    assert _code(raw) == "invalid_bridge"


@pytest.mark.parametrize(
    "target",
    ["/..%2fadmin", "/%2e%2e%2fadmin", "/..\\admin", "/%2e%2e%5cadmin", "/%252e%252e/admin"],
)
def test_dot_segments_hidden_in_encoded_slashes_or_backslashes_are_refused(target):
    with pytest.raises(ValueError):
        upstream_url("http://h/v1", target)


def test_an_upstream_url_cannot_hide_dot_segments_either():
    assert _code({"80": "http://h/v1/..%2f..%2fadmin"}) == "invalid_bridge"


class _Stream:
    def __init__(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.status_code, self.headers, self._body = status, headers, body

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        yield self._body

    async def aread(self) -> bytes:
        return self._body

    async def aclose(self) -> None:
        pass


class _Agent:
    """Plays the agent: hands over ``queued`` requests to polls, then nothing."""

    def __init__(self, queued: list[tuple[dict[str, Any], bytes]]) -> None:
        self.queued = queued
        self.answers: list[tuple[str, dict[str, str]]] = []
        self.polls = 0

    async def request(self, *args: Any, **kwargs: Any) -> Any:
        return {"ports": []}

    async def open_stream(self, endpoint: Any, method: str, path: str, **kw: Any) -> _Stream:
        if path == "/bridges/next":
            self.polls += 1
            if self.polls == 1:
                raise RuntimeError("not an ApiError: the relay must survive it")
            if not self.queued:
                await asyncio.sleep(0.05)
                return _Stream(204, {})
            meta, body = self.queued.pop(0)
            return _Stream(200, {HEADER_REQUEST: json.dumps(meta)}, body)
        self.answers.append((path, kw["headers"]))
        if isinstance(kw["content"], bytes):
            return _Stream(200, {})
        async for _ in kw["content"]:
            pass
        return _Stream(200, {})


def _request(n: int, body: bytes = b"") -> tuple[dict[str, Any], bytes]:
    return {"id": f"r{n}", "port": 4000, "method": "GET", "target": "/x", "headers": []}, body


async def _relay_with(
    agent: _Agent, upstream: Any, **settings: Any
) -> tuple[BridgeRelay, SandboxRecord]:
    relay = BridgeRelay(agent, Settings(**settings))  # type: ignore[arg-type]
    relay._http = httpx.AsyncClient(transport=httpx.MockTransport(upstream))
    record = SandboxRecord(sandbox_id="sb", tenant="t", image="i", bridges={"4000": "http://u"})
    record.agent = AgentEndpoint(base_url="http://agent", token="x")
    record.mark("ready")
    relay.start(record)
    return relay, record


async def _until(check: Any, within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        while not check():
            await asyncio.sleep(0.01)


async def test_deleting_a_sandbox_cancels_requests_its_upstream_has_not_answered():
    cancelled = asyncio.Event()

    async def never_answers(request: httpx.Request) -> httpx.Response:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        raise AssertionError

    agent = _Agent([_request(1)])
    relay, _ = await _relay_with(agent, never_answers)
    try:
        await _until(lambda: relay.in_flight("sb") == 1)
        relay.stop("sb")
        await asyncio.wait_for(cancelled.wait(), 5)
        assert relay.in_flight("sb") == 0
    finally:
        await relay.close()


async def test_requests_forwarded_at_once_per_sandbox_are_bounded():
    started = 0

    async def slow(request: httpx.Request) -> httpx.Response:
        nonlocal started
        started += 1
        await asyncio.Event().wait()
        raise AssertionError

    agent = _Agent([_request(n) for n in range(MAX_FORWARDS_PER_SANDBOX + 10)])
    relay, _ = await _relay_with(agent, slow)
    try:
        await _until(lambda: started == MAX_FORWARDS_PER_SANDBOX)
        await asyncio.sleep(0.3)
        assert started == MAX_FORWARDS_PER_SANDBOX
        assert len(agent.queued) == 10  # left with the agent, not taken
    finally:
        await relay.close()


async def test_a_body_past_the_cap_is_not_held_but_answered_413():
    agent = _Agent([_request(1, b"y" * 100)])
    relay, _ = await _relay_with(agent, lambda r: httpx.Response(200), bridge_max_request_bytes=10)
    try:
        await _until(lambda: agent.answers)
        assert agent.answers[0][1][HEADER_STATUS] == "413"
    finally:
        await relay.close()


async def test_non_ascii_upstream_headers_pass_as_sent():
    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=[(b"x-name", "caf\u00e9".encode("latin-1"))])

    agent = _Agent([_request(1)])
    relay, _ = await _relay_with(agent, upstream)
    try:
        await _until(lambda: agent.answers)
        sent = json.loads(agent.answers[0][1][HEADER_HEADERS])
        assert ["x-name", "caf\u00e9"] in sent
    finally:
        await relay.close()


class _RecordingStream:
    """An httpx network stream whose socket records its options (uvloop's is no
    socket.socket, hence not one here either)."""

    def __init__(self) -> None:
        self.options: list[tuple[int, int, int]] = []

    def get_extra_info(self, info: str) -> Any:
        return self if info == "socket" else None

    def setsockopt(self, level: int, name: int, value: int) -> None:
        self.options.append((level, name, value))


@pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="Linux only")
def test_the_upstream_answer_is_acknowledged_at_once():
    stream = _RecordingStream()
    _ack_promptly(httpx.Response(200, extensions={"network_stream": stream}))
    assert stream.options == [(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)]
    _ack_promptly(httpx.Response(200))  # no connection (a mock transport): nothing done


_BRIDGES_SCHEMA = CreateSandboxRequest.model_json_schema()["properties"]["bridges"]["anyOf"][0]
_PORT_PATTERN, _URL_SCHEMA = next(iter(_BRIDGES_SCHEMA["patternProperties"].items()))


@settings(max_examples=300, suppress_health_check=list(HealthCheck))
@given(
    port=st.from_regex(_PORT_PATTERN, fullmatch=True),
    url=st.from_regex(_URL_SCHEMA["pattern"], fullmatch=True).filter(
        lambda u: len(u) <= _URL_SCHEMA["maxLength"]
    ),
)
def test_what_the_schema_allows_the_bridge_checks_accept(port: str, url: str) -> None:
    """The OpenAPI schema's bridge rules are no wider than ``validate_bridges``: a client
    that validates against the schema is never refused for a bridge's form."""
    request = CreateSandboxRequest.model_validate({"image": "x", "bridges": {port: url}})
    assert validate_bridges(request.bridges, [], set()) == {str(int(port)): url}

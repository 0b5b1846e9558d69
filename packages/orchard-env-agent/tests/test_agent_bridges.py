"""The agent's half of service bridges, against a real agent process (the orchestrator's
part is played by the test: it polls ``/bridges/next`` and answers ``/bridges/{id}/response``).

A single-mode agent listens in its own network namespace, here the host's loopback.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from agent_harness import Agent

from orchard_env_agent.bridges import MAX_CONNECTIONS

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _configure(agent: Agent, ports: list[int], **extra: object) -> httpx.Response:
    return agent.client.post("/bridges", json={"ports": ports, **extra}, headers=agent.headers())


def _in_background(target: object, *args: object) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(target(*args)), daemon=True)  # type: ignore[operator]
    thread.start()
    return thread, out


def test_a_request_is_polled_and_its_answer_streams_back_chunk_by_chunk(single: Agent):
    port = _free_port()
    assert _configure(single, [port]).json() == {"ports": [port]}
    first_seen = threading.Event()

    def call() -> tuple[int, str, list[bytes]]:
        url = f"http://127.0.0.1:{port}/a/b?c=1"
        with httpx.stream("POST", url, content=b"hello", headers={"X-Mine": "1"}) as answer:
            chunks = []
            for chunk in answer.iter_raw():
                chunks.append(chunk)
                first_seen.set()
            return answer.status_code, answer.headers["content-type"], chunks

    thread, out = _in_background(call)
    polled = single.client.get("/bridges/next", params={"wait": 30}, headers=single.headers())
    assert polled.status_code == 200 and polled.content == b"hello"
    meta = json.loads(polled.headers["x-orchard-bridge-request"])
    assert (meta["port"], meta["method"], meta["target"]) == (port, "POST", "/a/b?c=1")
    assert ["x-mine", "1"] in [[k.lower(), v] for k, v in meta["headers"]]

    def body() -> Iterator[bytes]:
        yield b"data: one\n\n"
        assert first_seen.wait(30), "the first chunk was held back"
        yield b"data: two\n\n"

    headers = {
        **single.headers(),
        "X-Orchard-Bridge-Status": "201",
        "X-Orchard-Bridge-Headers": json.dumps([["content-type", "text/event-stream"]]),
    }
    answered = single.client.post(
        f"/bridges/{meta['id']}/response", content=body(), headers=headers
    )
    assert answered.json() == {"delivered": True}
    thread.join(30)
    status, kind, chunks = out[0]  # type: ignore[misc]
    assert (status, kind, b"".join(chunks)) == (
        201,
        "text/event-stream",
        b"data: one\n\ndata: two\n\n",
    )


def test_requests_nobody_takes_are_answered_503(single: Agent):
    port = _free_port()
    _configure(single, [port], stale_after_s=0.2)
    answer = httpx.get(f"http://127.0.0.1:{port}/x", timeout=30)
    assert (answer.status_code, answer.json()["code"]) == (503, "bridge_unavailable")


def test_a_body_over_the_cap_is_answered_413(single: Agent):
    port = _free_port()
    _configure(single, [port], max_request_bytes=10)
    answer = httpx.post(f"http://127.0.0.1:{port}/x", content=b"y" * 11, timeout=30)
    assert (answer.status_code, answer.json()["code"]) == (413, "too_large")


def test_reconfiguring_closes_ports_no_longer_asked_for(single: Agent):
    kept, dropped = _free_port(), _free_port()
    _configure(single, [kept, dropped])
    assert _configure(single, [kept]).json() == {"ports": [kept]}
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{dropped}/", timeout=5)


def test_nothing_queued_polls_204_and_unknown_answers_404(single: Agent):
    _configure(single, [])
    empty = single.client.get("/bridges/next", params={"wait": 0}, headers=single.headers())
    assert empty.status_code == 204
    headers = {**single.headers(), "X-Orchard-Bridge-Status": "200"}
    unknown = single.client.post("/bridges/nope/response", content=b"", headers=headers)
    assert (unknown.status_code, unknown.json()["code"]) == (404, "bridge_request_not_found")


@pytest.mark.parametrize("ports", [[0], [70000], ["80"], list(range(1, 18))])
def test_bad_port_lists_are_refused(single: Agent, ports: list[object]):
    answer = _configure(single, ports)  # type: ignore[arg-type]
    assert answer.status_code == 422


def _get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=30)


def _post(url: str, body: bytes) -> httpx.Response:
    return httpx.post(url, content=body, timeout=30)


def _poll_and_answer(agent: Agent, headers: list[list[str]], body: bytes = b"ok") -> dict:
    polled = agent.client.get("/bridges/next", params={"wait": 30}, headers=agent.headers())
    assert polled.status_code == 200, polled.text
    meta = json.loads(polled.headers["x-orchard-bridge-request"])
    answer = {
        **agent.headers(),
        "X-Orchard-Bridge-Status": "200",
        "X-Orchard-Bridge-Headers": json.dumps(headers),
    }
    return agent.client.post(f"/bridges/{meta['id']}/response", content=body, headers=answer)


def test_connections_past_the_cap_are_answered_503_busy(single: Agent):
    port = _free_port()
    _configure(single, [port])
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_CONNECTIONS)]
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/x", timeout=30)
        assert (answer.status_code, answer.json()["code"]) == (503, "bridge_busy")
    finally:
        for sock in idle:
            sock.close()
    thread, out = _in_background(_get, f"http://127.0.0.1:{port}/x")
    assert _poll_and_answer(single, []).json() == {"delivered": True}
    thread.join(30)
    assert out[0].status_code == 200  # type: ignore[attr-defined]


def test_request_bodies_held_at_once_are_bounded(single: Agent):
    port = _free_port()
    _configure(single, [port], max_request_bytes=100, stale_after_s=3)
    url = f"http://127.0.0.1:{port}/x"
    held = [_in_background(_post, url, b"y" * 100) for _ in range(4)]
    time.sleep(1)
    over = httpx.post(url, content=b"y" * 100, timeout=30)
    assert (over.status_code, over.json()["code"]) == (503, "bridge_busy")
    for thread, out in held:
        thread.join(30)
        assert out[0].json()["code"] == "bridge_unavailable"  # type: ignore[attr-defined]
    # all given back: a full body is taken again
    thread, out = _in_background(_post, url, b"y" * 100)
    assert _poll_and_answer(single, []).json() == {"delivered": True}
    thread.join(30)
    assert out[0].status_code == 200  # type: ignore[attr-defined]


def test_upstream_headers_beyond_ascii_reach_the_caller(single: Agent):
    port = _free_port()
    _configure(single, [port])
    thread, out = _in_background(_get, f"http://127.0.0.1:{port}/x")
    assert _poll_and_answer(single, [["x-name", "caf\u00e9"]]).json() == {"delivered": True}
    thread.join(30)
    assert out[0].headers.raw[0] == (b"x-name", b"caf\xe9")  # type: ignore[attr-defined]

"""Port forwarding to servers inside a sandbox, and the interactive terminal."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

pytestmark = pytest.mark.integration


def test_an_http_server_inside_a_network_blocked_sandbox_is_reachable(server, sandbox):
    sandbox.upload_content("/workspace/site/index.html", "<h1>inside</h1>")
    sandbox.start("cd /workspace/site && exec python3 -m http.server 8123 --bind 127.0.0.1")
    url = f"{server.url}/sandboxes/{sandbox.sandbox_id}/ports/8123/index.html"
    deadline = time.monotonic() + 20
    while True:
        response = httpx.get(url, params={"q": "1"})
        if response.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert response.status_code == 200 and response.text == "<h1>inside</h1>"
    missing = httpx.get(f"{server.url}/sandboxes/{sandbox.sandbox_id}/ports/8123/nope")
    assert missing.status_code == 404  # the sandboxed server's own answer passes through


ECHO_SERVER = """
import asyncio, websockets

async def echo(ws):
    async for message in ws:
        await ws.send(message)

async def main():
    async with websockets.serve(echo, "127.0.0.1", 8124):
        await asyncio.Future()

asyncio.run(main())
"""


def test_a_websocket_server_inside_the_sandbox_is_reachable(server, sandbox):
    sandbox.upload_content("/workspace/echo_ws.py", ECHO_SERVER)
    # The sandbox sees the host's /usr (locally) or its image, not this test's virtualenv:
    # run its python3 with a copy of `websockets` in the sandbox's own workspace.
    sandbox.upload_dir(Path(websockets.__file__).parent, "/workspace/lib/websockets")
    sandbox.start(["python3", "/workspace/echo_ws.py"], env={"PYTHONPATH": "/workspace/lib"})
    url = server.url.replace("http://", "ws://") + f"/sandboxes/{sandbox.sandbox_id}/ports/8124/"
    deadline = time.monotonic() + 20
    while True:
        try:
            with connect(url, open_timeout=5) as ws:
                ws.send("ping")
                assert ws.recv(timeout=5) == "ping"
                ws.send(b"\x00\x01binary")
                assert ws.recv(timeout=5) == b"\x00\x01binary"
                return
        except (OSError, InvalidStatus, ConnectionClosed):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_port_nobody_listens_on_is_502(server, sandbox):
    response = httpx.get(f"{server.url}/sandboxes/{sandbox.sandbox_id}/ports/8999/")
    assert response.status_code == 502 and response.json()["code"] == "port_not_listening"


def test_the_pty_runs_an_interactive_shell(server, sandbox):
    ws_url = server.url.replace("http://", "ws://") + f"/sandboxes/{sandbox.sandbox_id}/exec/pty"
    with connect(ws_url, open_timeout=10) as ws:
        ws.send(b"echo pty-$((6*7))\n")
        seen = b""
        deadline = time.monotonic() + 10
        while b"pty-42" not in seen and time.monotonic() < deadline:
            frame = ws.recv(timeout=5)
            seen += frame if isinstance(frame, bytes) else frame.encode()
        assert b"pty-42" in seen


def test_port_request_returns_the_sandboxed_servers_answer_and_raises_the_services_own(
    server, sandbox
):
    from orchard_env_client.errors import OrchardError

    sandbox.upload_content("/workspace/site2/a b.txt", "spaced")
    sandbox.start("cd /workspace/site2 && exec python3 -m http.server 8126 --bind 127.0.0.1")
    deadline = time.monotonic() + 20
    while True:
        try:
            response = sandbox.port_request(8126, "GET", "a b.txt")
            break
        except OrchardError as exc:  # nothing listens yet: the orchestrator's own 502
            assert exc.status == 502
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert response.status_code == 200 and response.text == "spaced"
    assert sandbox.port_request(8126, "GET", "nope").status_code == 404  # passed through
    assert sandbox.port_url(8126, "/x").endswith(f"/sandboxes/{sandbox.sandbox_id}/ports/8126/x")
    with pytest.raises(OrchardError) as info:
        sandbox.port_request(8127, "GET", "")
    assert info.value.status == 502 and info.value.code == "port_not_listening"


def test_port_request_bounds_what_it_reads_and_refuses_dot_segments(server, sandbox):
    from orchard_env_client.errors import PayloadTooLarge

    sandbox.upload_content("/workspace/site3/big.bin", b"x" * 300_000)
    sandbox.start("cd /workspace/site3 && exec python3 -m http.server 8128 --bind 127.0.0.1")
    deadline = time.monotonic() + 20
    while True:
        try:
            ok = sandbox.port_request(8128, "GET", "big.bin", max_bytes=400_000)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert len(ok.content) == 300_000
    with pytest.raises(PayloadTooLarge):
        sandbox.port_request(8128, "GET", "big.bin", max_bytes=100_000)
    for path in ("../../x", "a/./b", ".."):
        with pytest.raises(ValueError, match="segments"):
            sandbox.port_request(8128, "DELETE", path)

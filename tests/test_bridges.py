"""Service bridges: a network-less sandbox reaches a configured upstream, and nothing else.

The upstream is a real HTTP server on the host's loopback; the calls are made from inside
real sandboxes (``bridge_probe.py``, stdlib Python: the images have python3), relayed by
the real agent and orchestrator.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import attrs
import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from orchard_env_client import Sandbox, SandboxClient
from orchard_testing import (
    RunningServer,
    StubEndpoint,
    free_port,
    only_backend,
    wait_for_removals,
)

PROBE = Path(__file__).with_name("bridge_probe.py")
PORT = 4000  # the bridge's port inside the sandbox
BIG = hashlib.sha256(b"seed").digest() * (8 << 20 >> 5)  # 8 MiB, not compressible by accident


@attrs.define
class Upstream(StubEndpoint):
    """Echo, a large answer, and server-sent events that pause until the test releases
    them (the first event must arrive while the upstream is still answering)."""

    release: threading.Event = attrs.field(factory=threading.Event)
    waited_out: bool = False

    async def _echo(self, request: Request) -> JSONResponse:
        body = await request.body()
        return JSONResponse(
            {
                "method": request.method,
                "path": request.url.path,
                "query": request.url.query,
                "body": body.decode(),
                "host": request.headers.get("host"),
                "probe": request.headers.get("x-probe"),
            }
        )

    async def _big(self, request: Request) -> Response:
        return Response(BIG, media_type="application/octet-stream")

    async def _events(self, request: Request) -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            yield b"data: first\n\n"
            released = await anyio.to_thread.run_sync(self.release.wait, 120)
            self.waited_out = not released
            yield b"data: second\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    def routes(self) -> list[Route]:
        methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
        return [
            Route("/v1/echo/{rest:path}", self._echo, methods=methods),
            Route("/v1/big", self._big),
            Route("/v1/sse", self._events),
        ]


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as served:
        yield served
        served.release.set()


def probe(sbx: Sandbox, *args: str) -> Any:
    """Run bridge_probe.py in the sandbox; its JSON (or plain) output."""
    sbx.upload_file(PROBE, "/tmp/bridge_probe.py")
    job = sbx.exec(["python3", "/tmp/bridge_probe.py", *args], timeout=300)
    assert job.exit_code == 0, job.stderr
    out = job.stdout.strip()
    return json.loads(out) if out.startswith("{") else out


def url(path: str, port: int = PORT) -> str:
    return f"http://127.0.0.1:{port}{path}"


@pytest.fixture
def bridged(server: RunningServer, image: str, upstream: Upstream) -> Iterator[Sandbox]:
    with SandboxClient(base_url=server.url) as client:
        yield client.create_sandbox(image, bridges={PORT: f"{upstream.url}/v1"})


def test_a_bridge_relays_method_path_query_and_body(bridged, upstream):
    answer = probe(bridged, "request", "POST", url("/echo/a/b%20c?x=1&y=two"), "5")
    assert answer["status"] == 200
    echo = json.loads(answer["text"])
    assert echo == {
        "method": "POST",
        "path": "/v1/echo/a/b c",
        "query": "x=1&y=two",
        "body": "xxxxx",
        "host": f"127.0.0.1:{upstream.port}",
        "probe": "yes",
    }
    assert bridged.refresh().bridges == {str(PORT): f"{upstream.url}/v1"}


def test_a_large_answer_arrives_whole(bridged):
    answer = probe(bridged, "request", "GET", url("/big"))
    assert answer["status"] == 200
    assert (answer["size"], answer["sha256"]) == (len(BIG), hashlib.sha256(BIG).hexdigest())


def test_server_sent_events_arrive_before_the_upstream_finishes(bridged, upstream):
    upstream.release.clear()
    lines: list[str] = []
    bridged.upload_file(PROBE, "/tmp/bridge_probe.py")
    command = ["python3", "-u", "/tmp/bridge_probe.py", "sse", url("/sse")]
    for event in bridged.exec_stream(command, timeout=300):
        if event.type == "stdout" and event.data:
            lines += event.data.splitlines()
            if "data: first" in lines and not upstream.release.is_set():
                upstream.release.set()  # only now may the upstream send the rest
    assert not upstream.waited_out, "the first event was held back until the upstream ended"
    assert [line for line in lines if line] == ["data: first", "data: second"]


def test_dot_segments_are_refused(bridged):
    answer = probe(bridged, "request", "GET", url("/echo/%2e%2e/%2e%2e/secret"))
    assert answer["status"] == 400
    assert json.loads(answer["text"])["code"] == "bad_bridge_request"


def test_an_unreachable_upstream_answers_502(server, image):
    with SandboxClient(base_url=server.url) as client:
        sbx = client.create_sandbox(image, bridges={PORT: f"http://127.0.0.1:{free_port()}"})
        answer = probe(sbx, "request", "GET", url("/anything"))
    assert answer["status"] == 502
    assert json.loads(answer["text"])["code"] == "upstream_unreachable"


def test_only_configured_ports_listen_and_only_in_their_sandbox(bridged, server, image):
    assert probe(bridged, "connect", str(PORT + 1)) == "ConnectionRefusedError"
    with SandboxClient(base_url=server.url) as client:
        neighbour = client.create_sandbox(image)
        assert probe(neighbour, "connect", str(PORT)) == "ConnectionRefusedError"


@pytest.mark.parametrize(
    ("bridges", "code"),
    [
        ({"0": "http://127.0.0.1:1"}, "invalid_bridge"),
        ({"70000": "http://127.0.0.1:1"}, "invalid_bridge"),
        ({"web": "http://127.0.0.1:1"}, "invalid_bridge"),
        ({"4000": "ftp://127.0.0.1/"}, "invalid_bridge"),
        ({"4000": "http://user:pw@127.0.0.1/"}, "invalid_bridge"),
        ({"4000": "http://127.0.0.1/v1?key=1"}, "invalid_bridge"),
        ({str(4000 + i): "http://127.0.0.1:1" for i in range(17)}, "invalid_bridge"),
    ],
)
def test_invalid_bridges_are_refused_at_create(server, image, bridges, code):
    answer = httpx.post(f"{server.url}/sandboxes", json={"image": image, "bridges": bridges})
    assert (answer.status_code, answer.json()["code"]) == (400, code), answer.text


@only_backend("kubernetes")  # the only backend whose agent listens inside the sandbox
def test_the_agents_own_port_cannot_be_bridged(server, image):
    from orchard_env_server.backends.kubernetes.spec import AGENT_PORT

    body = {"image": image, "bridges": {str(AGENT_PORT): "http://127.0.0.1:1"}}
    answer = httpx.post(f"{server.url}/sandboxes", json=body)
    assert (answer.status_code, answer.json()["code"]) == (400, "bridge_port_reserved")


def test_the_server_limits_upstreams_and_request_bodies(fresh_server, image, upstream):
    fresh_server.start(
        "--bridge-allow-upstream", f"{upstream.url}/v1", "--bridge-max-request-bytes", "65536"
    )
    elsewhere = {"image": image, "bridges": {"4000": f"{upstream.url}/v10"}}
    refused = httpx.post(f"{fresh_server.url}/sandboxes", json=elsewhere)
    assert (refused.status_code, refused.json()["code"]) == (400, "bridge_upstream_not_allowed")
    with SandboxClient(base_url=fresh_server.url) as client:
        sbx = client.create_sandbox(image, bridges={"4000": f"{upstream.url}/v1/echo"})
        assert probe(sbx, "request", "PUT", url("/ok"), "65536")["status"] == 200
        too_big = probe(sbx, "request", "PUT", url("/ok"), "65537")
    assert too_big["status"] == 413 and json.loads(too_big["text"])["code"] == "too_large"


def _listening_inode(holder_pid: int, port: int) -> str:
    """The inode of the socket listening on 127.0.0.1:port in a process's network namespace."""
    for line in Path(f"/proc/{holder_pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == f"0100007F:{port:04X}" and fields[3] == "0A":
            return fields[9]
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} in the sandbox")


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


@only_backend("local")  # one agent serves every sandbox: it must let go of their listeners
def test_deleting_a_sandbox_closes_its_bridge_listeners(server, image, upstream):
    with SandboxClient(base_url=server.url) as client:
        sbx = client.create_sandbox(image, bridges={PORT: upstream.url})
        home = server.state_dir / "sandboxes" / sbx.sandbox_id
        record = json.loads((home / "record.json").read_text())
        listener = _listening_inode(record["backend_state"]["holder_pid"], PORT)
        agent = int(json.loads((server.state_dir / "agent.json").read_text())["pid"])
        assert listener in _socket_inodes(agent)
        sbx.delete()
        wait_for_removals(server.url)  # the agent forgets the sandbox after delete answers
        assert listener not in _socket_inodes(agent)


@only_backend("local")  # recovery itself is tested per backend in test_lifecycle.py
def test_bridges_work_again_after_an_orchestrator_restart(fresh_server, image, upstream):
    fresh_server.start()
    with SandboxClient(base_url=fresh_server.url, auto_cleanup=False) as client:
        sbx = client.create_sandbox(image, bridges={PORT: f"{upstream.url}/v1"})
        assert probe(sbx, "request", "GET", url("/echo/before"))["status"] == 200
    fresh_server.kill()
    fresh_server.start()
    with SandboxClient(base_url=fresh_server.url) as client:
        again = client.get_sandbox(sbx.sandbox_id)
        assert again.info.bridges == {str(PORT): f"{upstream.url}/v1"}
        answer = probe(again, "request", "GET", url("/echo/after"))
        assert json.loads(answer["text"])["path"] == "/v1/echo/after"
        again.delete()

"""The orchestrator's connection pools to agents, against a real HTTP server on loopback.

The server answers each request with the client port of the connection it came on, so a
test can tell a reused keep-alive connection from a new one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from orchard_env_server.agent_client import AgentClient
from orchard_env_server.records import AgentEndpoint


async def _peer_port(request: web.Request) -> web.Response:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return web.json_response({"port": peer[1] if peer else None})


@pytest.fixture
async def agent_url() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/who", _peer_port)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _port(agents: AgentClient, endpoint: AgentEndpoint) -> int:
    answer = await agents.request(endpoint, "GET", "/who")
    return int(answer["port"])


async def test_the_sandboxes_of_a_shared_agent_share_one_connection(agent_url: str) -> None:
    agents = AgentClient()
    sandboxes = [AgentEndpoint(agent_url, f"t{i}", sandbox_header=f"sbx-{i}") for i in range(50)]
    try:
        ports = {await _port(agents, endpoint) for endpoint in sandboxes}
        assert len(ports) == 1, "sequential calls for 50 sandboxes of one agent: one connection"
        await agents.forget(sandboxes[0])
        assert await _port(agents, sandboxes[1]) in ports, "forgetting one kept the pool"
    finally:
        await agents.aclose()


async def test_an_agent_of_its_own_gets_a_pool_that_goes_with_its_sandbox(agent_url: str) -> None:
    agents = AgentClient()
    own = AgentEndpoint(agent_url, "token")
    try:
        first = await _port(agents, own)
        assert await _port(agents, own) == first, "keep-alive within the sandbox's pool"
        await agents.forget(own)
        assert await _port(agents, own) != first, "forgotten: its connection was closed"
    finally:
        await agents.aclose()

"""The aiohttp transport's choice and failure mapping (the live server test is in tests/)."""

from __future__ import annotations

import socket

import pytest

from orchard_env_client import AsyncSandboxClient
from orchard_env_client._aiohttp_transport import AiohttpTransport, wanted
from orchard_env_client._http import default_transport
from orchard_env_client.errors import ConnectionFailed


def test_default_is_aiohttp_unless_told_or_proxied(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(default_transport(), AiohttpTransport)
    monkeypatch.setenv("ORCHARD_ENV_CLIENT_TRANSPORT", "httpx")
    assert default_transport() is None
    monkeypatch.delenv("ORCHARD_ENV_CLIENT_TRANSPORT")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert not wanted() and default_transport() is None


async def test_connection_refused_is_connection_failed() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    async with AsyncSandboxClient(
        base_url=f"http://127.0.0.1:{port}", max_retries=0, transport=AiohttpTransport()
    ) as c:
        with pytest.raises(ConnectionFailed):
            await c.list_sandboxes()

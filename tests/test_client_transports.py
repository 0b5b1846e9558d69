"""The SDK behaves the same over aiohttp's pool (the default) and over httpx's own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from orchard_env_client import AsyncSandboxClient
from orchard_env_client._aiohttp_transport import AiohttpTransport
from orchard_env_client.errors import NotFound
from orchard_testing import RunningServer, only_backend

pytestmark = [pytest.mark.integration]
TRANSPORTS = {"aiohttp": AiohttpTransport, "httpx": lambda: None}


@pytest.fixture(params=sorted(TRANSPORTS))
async def client(
    request: pytest.FixtureRequest, server: RunningServer
) -> AsyncIterator[AsyncSandboxClient]:
    transport = TRANSPORTS[request.param]()
    async with AsyncSandboxClient(base_url=server.url, transport=transport) as c:
        if transport is None:  # the test asks for httpx's own: make sure it got it
            c._http._client._transport = httpx.AsyncHTTPTransport()
        yield c


@only_backend("local")
async def test_exec_stream_files_and_errors(
    client: AsyncSandboxClient, image: str, tmp_path: Path
) -> None:
    sb = await client.create_sandbox(image)
    try:
        result = await sb.exec("printf 'a b\\n'; echo err >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr) == (3, "a b\n", "err\n")
        events = [e async for e in sb.exec_stream("for i in 1 2 3; do echo $i; done")]
        assert "".join(e.data or "" for e in events if e.type == "stdout") == "1\n2\n3\n"
        assert events[-1].type == "exit"
        # A streamed upload (no Content-Length) and a streamed download, 3 MiB each way.
        blob = bytes(range(256)) * (3 * 4096)
        src = tmp_path / "blob"
        src.write_bytes(blob)
        await sb.upload_file(src, "/workspace/blob")
        assert await sb.download_content("/workspace/blob") == blob
        await sb.upload_content("/workspace/name with spaces %2F.txt", "x")
        assert await sb.download_content("/workspace/name with spaces %2F.txt") == b"x"
        with pytest.raises(NotFound):
            await sb.download_content("/workspace/missing")
    finally:
        await sb.delete()
    with pytest.raises(NotFound):
        await client.get_sandbox(sb.sandbox_id)

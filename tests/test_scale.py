"""A 50-sandbox create/exec/delete loop finishes with zero errors."""

from __future__ import annotations

import asyncio

import pytest

from orchard_env_client import AsyncSandboxClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_fifty_sandboxes_create_exec_delete_without_error(server, image):
    async with AsyncSandboxClient(base_url=server.url) as client:

        async def one(i: int) -> str:
            sbx = await client.create_sandbox(image, labels={"scale": "50"})
            job = await sbx.exec(f"echo {i}")
            await sbx.delete()
            return job.stdout

        outputs = await asyncio.gather(*(one(i) for i in range(50)))
    assert outputs == [f"{i}\n" for i in range(50)]

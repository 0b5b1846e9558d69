"""``repr()`` of clients, sandboxes and jobs: short, useful, the same for sync and async
(the async object describes itself; the sync wrapper shows that under its own name)."""

from __future__ import annotations

import httpx
import pytest
from client_fakes import job_json, sandbox_json

import orchard_env_client as oc

pytestmark = pytest.mark.fast

DELETED = httpx.Response(200, json={"status": "deleted", "sandbox_id": "sb-1"})


def serve(fake, **sandbox):
    fake.on("POST", "/sandboxes", httpx.Response(201, json=sandbox_json(**sandbox)))
    fake.on("GET", "/sandboxes/sb-1/wait", httpx.Response(200, json=sandbox_json(**sandbox)))
    fake.on("POST", "/sandboxes/sb-1/exec", httpx.Response(200, json=job_json(status="queued")))
    fake.on("GET", "/jobs/job-1/wait", httpx.Response(200, json=job_json()))
    fake.on("DELETE", "/sandboxes/sb-1", DELETED)
    return fake


def test_the_sync_client_shows_its_url_and_never_the_key(fake):
    client = oc.SandboxClient(
        base_url="http://127.0.0.1:8000/", api_key="sekret-key", transport=fake.transport
    )
    assert repr(client) == "<SandboxClient url=http://127.0.0.1:8000>"
    client.close()
    assert repr(client) == "<SandboxClient url=http://127.0.0.1:8000 closed>"
    assert "sekret" not in repr(client)


def test_credentials_in_the_url_are_left_out(fake):
    url = "https://me:pw@orchard.example:8443/api"
    with oc.SandboxClient(base_url=url, transport=fake.transport) as client:
        assert repr(client) == "<SandboxClient url=https://orchard.example:8443/api>"


def test_sync_sandbox_and_job_handles(fake):
    serve(fake, image="python:3.11-slim")
    with oc.SandboxClient(base_url="http://x", transport=fake.transport) as client:
        sandbox = client.create_sandbox("python:3.11-slim")
        assert repr(sandbox) == "<Sandbox sb-1 image=python:3.11-slim state=ready>"
        job = sandbox.start("sleep 1")
        assert repr(job) == "<JobHandle job-1>"  # nothing fetched yet: no state to show
        job.wait()
        assert repr(job) == "<JobHandle job-1 state=succeeded exit_code=0>"
        sandbox.delete()
        assert repr(sandbox) == "<Sandbox sb-1 image=python:3.11-slim state=deleted>"


def test_a_failed_sandbox_shows_the_start_of_its_error(fake):
    error = "image 'nope' is not in the store; run `orchard-env image pull nope` " * 3
    failed = sandbox_json(image="nope", status="failed", error=error)
    fake.on("GET", "/sandboxes/sb-1", httpx.Response(200, json=failed))
    with oc.SandboxClient(base_url="http://x", transport=fake.transport) as client:
        text = repr(client.get_sandbox("sb-1"))
    assert text.startswith("<Sandbox sb-1 image=nope state=failed error=\"image 'nope' is")
    assert text.endswith('…">') and len(text) < 120


def test_a_timed_out_job_says_so(fake):
    timed_out = job_json(status="failed", exit_code=137, timed_out=True)
    fake.on("GET", "/jobs/job-1", httpx.Response(200, json=timed_out))
    with oc.SandboxClient(base_url="http://x", transport=fake.transport) as client:
        fake.on("GET", "/sandboxes/sb-1", httpx.Response(200, json=sandbox_json()))
        job = client.get_sandbox("sb-1").job("job-1")
        job.refresh()
        assert repr(job) == "<JobHandle job-1 state=failed exit_code=137 timed_out>"


async def test_the_async_objects_read_the_same_under_their_own_names(fake):
    serve(fake)
    async with oc.AsyncSandboxClient(
        base_url="http://x", api_key="k", transport=fake.transport
    ) as ac:
        assert repr(ac) == "<AsyncSandboxClient url=http://x>"
        sandbox = await ac.create_sandbox("host")
        assert repr(sandbox) == "<AsyncSandbox sb-1 image=host state=ready>"
        job = await sandbox.start("true")
        await job.wait()
        assert repr(job) == "<AsyncJobHandle job-1 state=succeeded exit_code=0>"

"""The sync API is derived from the async one: same names, same results, same exceptions."""

from __future__ import annotations

import inspect
from pathlib import Path

import httpx
import pytest
from client_fakes import job_json, sandbox_json

import orchard_env_client as oc
from orchard_env_client import _stubgen, errors

pytestmark = pytest.mark.fast

PAIRS = [
    (oc.SandboxClient, oc.AsyncSandboxClient),
    (oc.Sandbox, oc.AsyncSandbox),
    (oc.JobHandle, oc.AsyncJobHandle),
]


def public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS)
def test_sync_and_async_public_methods_are_identical(sync_cls, async_cls):
    assert public(sync_cls) == public(async_cls)


def test_the_checked_in_stub_matches_the_async_signatures():
    stub = Path(_stubgen.__file__).with_name("sync.pyi").read_text()
    assert _stubgen.normalize(stub) == _stubgen.normalize(_stubgen.render()), (
        "sync.pyi is stale: run `uv run python -m orchard_env_client._stubgen`"
    )


def test_sync_methods_keep_the_async_signature_for_help():
    assert inspect.signature(oc.Sandbox.exec) == inspect.signature(oc.AsyncSandbox.exec)


def serve(fake):
    fake.on("POST", "/sandboxes", httpx.Response(201, json=sandbox_json(status="pending")))
    fake.on("GET", "/sandboxes/sb-1/wait", httpx.Response(200, json=sandbox_json()))
    fake.on("POST", "/sandboxes/sb-1/exec", httpx.Response(200, json=job_json()))
    stream = b'{"type":"stdout","data":"hi\\n"}\n{"type":"exit","job_id":"job-1","status":"succeeded","exit_code":0}\n'
    fake.on("POST", "/sandboxes/sb-1/exec/stream", httpx.Response(200, content=stream))
    fake.on(
        "DELETE",
        "/sandboxes/sb-1",
        httpx.Response(200, json={"status": "deleted", "sandbox_id": "sb-1"}),
    )
    return fake


async def test_sync_and_async_give_the_same_results(fake):
    serve(fake)
    async with oc.AsyncSandboxClient(base_url="http://x", transport=fake.transport) as ac:
        asb = await ac.create_sandbox("host")
        ajob = await asb.exec("echo hi")
        aevents = [e async for e in asb.exec_stream("echo hi")]
    with oc.SandboxClient(base_url="http://x", transport=fake.transport) as sc:
        sb = sc.create_sandbox("host")
        assert isinstance(sb, oc.Sandbox) and sb.sandbox_id == "sb-1"
        assert sb.info == asb.info
        assert sb.exec("echo hi") == ajob
        assert list(sb.exec_stream("echo hi")) == aevents


def test_exceptions_cross_the_loop_with_their_type(fake):
    fake.on(
        "GET",
        "/sandboxes/nope",
        httpx.Response(
            404, json={"detail": "no", "code": "sandbox_not_found"}, headers={"X-Request-ID": "r1"}
        ),
    )
    with (
        oc.SandboxClient(base_url="http://x", transport=fake.transport) as sc,
        pytest.raises(errors.SandboxNotFound) as err,
    ):
        sc.get_sandbox("nope")
    assert err.value.status == 404 and err.value.request_id == "r1"


def test_the_sync_context_manager_deletes_created_sandboxes_and_closes(fake):
    serve(fake)
    with oc.SandboxClient(base_url="http://x", transport=fake.transport) as sc:
        sc.create_sandbox("host")
    assert len(fake.calls("DELETE", "/sandboxes/sb-1")) == 1
    with pytest.raises(RuntimeError, match="closed"):
        sc.health()


def test_auto_cleanup_false_leaves_sandboxes(fake):
    serve(fake)
    with oc.SandboxClient(base_url="http://x", transport=fake.transport, auto_cleanup=False) as sc:
        sc.create_sandbox("host")
    assert fake.calls("DELETE", "/sandboxes/sb-1") == []


def test_sync_background_job_handle(fake):
    serve(fake)
    fake.on(
        "POST",
        "/sandboxes/sb-1/exec",
        httpx.Response(200, json={"job_id": "job-1", "status": "queued"}),
    )
    fake.on("GET", "/jobs/job-1/wait", httpx.Response(200, json=job_json()))
    with (
        oc.SandboxClient(base_url="http://x", transport=fake.transport) as sc,
        sc.create_sandbox("host") as sb,
    ):
        job = sb.start("echo hi")
        assert isinstance(job, oc.JobHandle) and job.wait(timeout=5).stdout == "hi\n"
    assert len(fake.calls("DELETE", "/sandboxes/sb-1")) >= 1

"""The async client: configuration, retries, create/wait, exec, streaming and files."""

from __future__ import annotations

import json

import httpx
import pytest
from client_fakes import body, job_json, sandbox_json

from orchard_env_client import AsyncSandboxClient, errors

pytestmark = pytest.mark.fast


def client(fake, **kw) -> AsyncSandboxClient:
    return AsyncSandboxClient(base_url="http://orchard", transport=fake.transport, **kw)


async def test_env_vars_supply_url_and_key_and_every_request_gets_an_id(fake, monkeypatch):
    monkeypatch.setenv("ORCHARD_ENV_URL", "http://from-env:9")
    monkeypatch.setenv("ORCHARD_ENV_API_KEY", "k-env")
    fake.on("GET", "/health", httpx.Response(200, json={"status": "ok", "backend": "local"}))
    async with AsyncSandboxClient(transport=fake.transport) as c:
        assert (await c.health()).backend == "local"
        await c.health()
    first, second = fake.requests
    assert str(first.url).startswith("http://from-env:9/")
    assert first.headers["X-API-Key"] == "k-env"
    assert len(first.headers["X-Request-ID"]) == 32
    assert first.headers["X-Request-ID"] != second.headers["X-Request-ID"]


async def test_default_url_without_env():
    c = AsyncSandboxClient()
    assert c.base_url == "http://127.0.0.1:8000"
    await c.close()


async def test_get_retries_on_503_honouring_retry_after(fake, no_backoff_sleep):
    busy = httpx.Response(
        503, json={"detail": "busy", "code": "overloaded"}, headers={"Retry-After": "2"}
    )
    fake.on("GET", "/sandboxes/sb-1", busy, httpx.Response(200, json=sandbox_json()))
    async with client(fake) as c:
        sandbox = await c.get_sandbox("sb-1")
    assert sandbox.info.status == "ready" and no_backoff_sleep == [2.0]
    ids = {r.headers["X-Request-ID"] for r in fake.requests}
    assert len(ids) == 1  # one logical request, one id across retries


async def test_retry_after_is_capped_and_retries_end_with_overloaded(fake, no_backoff_sleep):
    busy = httpx.Response(503, json={"detail": "busy"}, headers={"Retry-After": "999"})
    fake.on("GET", "/sandboxes/sb-1", busy)
    async with client(fake, max_retries=2) as c:
        with pytest.raises(errors.Overloaded) as err:
            await c.get_sandbox("sb-1")
    assert err.value.retry_after == 999 and no_backoff_sleep == [30.0, 30.0]
    assert len(fake.calls("GET", "/sandboxes/sb-1")) == 3


async def test_connection_errors_are_retried_for_get_but_not_for_exec(fake, no_backoff_sleep):
    attempts = {"n": 0}

    def flaky(request):
        attempts["n"] += 1
        if attempts["n"] < 3:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json=sandbox_json())

    fake.on("GET", "/sandboxes/sb-1", flaky)

    def down(request):
        raise httpx.ConnectError("refused", request=request)

    fake.on("POST", "/sandboxes/sb-1/exec", down)
    async with client(fake, auto_cleanup=False) as c:
        sandbox = await c.get_sandbox("sb-1")
        assert attempts["n"] == 3 and len(no_backoff_sleep) == 2
        with pytest.raises(errors.ConnectionFailed):
            await sandbox.exec("echo hi")
    assert len(fake.calls("POST", "/sandboxes/sb-1/exec")) == 1


async def test_exec_is_not_retried_on_503(fake):
    fake.on("GET", "/sandboxes/sb-1", httpx.Response(200, json=sandbox_json()))
    fake.on("POST", "/sandboxes/sb-1/exec", httpx.Response(503, json={"detail": "busy"}))
    async with client(fake) as c:
        sandbox = await c.get_sandbox("sb-1")
        with pytest.raises(errors.Overloaded):
            await sandbox.exec("echo hi")
    assert len(fake.calls("POST", "/sandboxes/sb-1/exec")) == 1


async def test_create_sends_only_given_fields_and_waits_until_ready(fake):
    timeout_408 = httpx.Response(408, json={"detail": "not yet", "code": "wait_timeout"})
    fake.on("POST", "/sandboxes", httpx.Response(201, json=sandbox_json(status="pending")))
    fake.on("GET", "/sandboxes/sb-1/wait", timeout_408, httpx.Response(200, json=sandbox_json()))
    fake.on(
        "DELETE",
        "/sandboxes/sb-1",
        httpx.Response(200, json={"status": "deleted", "sandbox_id": "sb-1"}),
    )
    async with client(fake) as c:
        sandbox = await c.create_sandbox("host", labels={"run": "x"}, timeout=100)
        assert sandbox.info.status == "ready" and c.created_sandbox_ids == ["sb-1"]
    sent = body(fake.calls("POST", "/sandboxes")[0])
    assert sent == {"image": "host", "block_network": True, "timeout": 100, "labels": {"run": "x"}}
    waits = fake.calls("GET", "/sandboxes/sb-1/wait")
    assert len(waits) == 2 and float(waits[0].url.params["timeout"]) <= 30
    assert len(fake.calls("DELETE", "/sandboxes/sb-1")) == 1  # auto_cleanup on exit


async def test_a_failed_sandbox_raises_sandbox_failed_and_is_deleted(fake):
    fake.on("POST", "/sandboxes", httpx.Response(201, json=sandbox_json(status="pending")))
    failed = sandbox_json(status="failed", error="image not found")
    fake.on("GET", "/sandboxes/sb-1/wait", httpx.Response(200, json=failed))
    fake.on(
        "DELETE",
        "/sandboxes/sb-1",
        httpx.Response(200, json={"status": "deleted", "sandbox_id": "sb-1"}),
    )
    async with client(fake) as c:
        with pytest.raises(errors.SandboxFailed, match="image not found") as err:
            await c.create_sandbox("nope")
        assert err.value.sandbox is not None and c.created_sandbox_ids == []
    assert len(fake.calls("DELETE", "/sandboxes/sb-1")) == 1


async def test_create_times_out_client_side_and_deletes(fake):
    fake.on("POST", "/sandboxes", httpx.Response(201, json=sandbox_json(status="pending")))
    fake.on("GET", "/sandboxes/sb-1/wait", httpx.Response(408, json={"detail": "slow"}))
    fake.on(
        "DELETE",
        "/sandboxes/sb-1",
        httpx.Response(404, json={"detail": "gone", "code": "sandbox_not_found"}),
    )
    async with client(fake) as c:
        with pytest.raises(errors.SandboxTimeout):
            await c.create_sandbox("host", timeout=0.05)
    assert len(fake.calls("DELETE", "/sandboxes/sb-1")) == 1


async def test_exec_keeps_waiting_when_the_server_answers_running(fake):
    fake.on("GET", "/sandboxes/sb-1", httpx.Response(200, json=sandbox_json()))
    fake.on("POST", "/sandboxes/sb-1/exec", httpx.Response(200, json=job_json(status="running")))
    fake.on(
        "GET",
        "/jobs/job-1/wait",
        httpx.Response(408, json={"detail": "still running"}),
        httpx.Response(200, json=job_json(exit_code=0)),
    )
    async with client(fake) as c:
        sandbox = await c.get_sandbox("sb-1")
        job = await sandbox.exec(["echo", "hi"], cwd="/w", timeout=5)
    assert job.succeeded and job.stdout == "hi\n"
    assert body(fake.calls("POST", "/sandboxes/sb-1/exec")[0]) == {
        "command": ["echo", "hi"],
        "timeout_seconds": 5,
        "cwd": "/w",
        "login_shell": False,
        "wait": True,
    }
    assert len(fake.calls("GET", "/jobs/job-1/wait")) == 2


async def test_stream_yields_output_events_then_the_exit_job(fake):
    lines = [
        {"type": "stdout", "data": "1\n"},
        {"type": "stderr", "data": "e\n"},
        {"type": "exit", **job_json(stdout="1\n")},
    ]
    ndjson = "".join(json.dumps(x) + "\n" for x in lines).encode()
    fake.on("GET", "/sandboxes/sb-1", httpx.Response(200, json=sandbox_json()))
    fake.on("POST", "/sandboxes/sb-1/exec/stream", httpx.Response(200, content=ndjson))
    async with client(fake) as c:
        sandbox = await c.get_sandbox("sb-1")
        events = [e async for e in sandbox.exec_stream("echo 1")]
    assert [e.type for e in events] == ["stdout", "stderr", "exit"]
    assert events[0].data == "1\n" and events[-1].job is not None and events[-1].job.exit_code == 0


async def test_background_job_status_wait_and_cancel(fake):
    fake.on("GET", "/sandboxes/sb-1", httpx.Response(200, json=sandbox_json()))
    fake.on(
        "POST",
        "/sandboxes/sb-1/exec",
        httpx.Response(200, json={"job_id": "job-1", "status": "queued"}),
    )
    fake.on("GET", "/jobs/job-1", httpx.Response(200, json=job_json(status="running")))
    fake.on("GET", "/jobs/job-1/wait", httpx.Response(200, json=job_json()))
    fake.on("POST", "/jobs/job-1/cancel", httpx.Response(200, json=job_json(status="failed")))
    async with client(fake) as c:
        job = await (await c.get_sandbox("sb-1")).start("sleep 1")
        assert job.job_id == "job-1" and await job.status() == "running"
        assert (await job.wait(timeout=5)).succeeded
        await job.cancel()
    assert body(fake.calls("POST", "/sandboxes/sb-1/exec")[0])["wait"] is False


async def test_files_move_raw_bytes_and_downloads_land_whole(fake, tmp_path):
    stored: dict[str, bytes] = {}

    def put(request):
        stored[request.url.params["path"]] = request.content
        return httpx.Response(200, json={"success": True})

    fake.on("GET", "/sandboxes/sb-1", httpx.Response(200, json=sandbox_json()))
    fake.on("PUT", "/sandboxes/sb-1/fs", put)
    fake.on(
        "GET",
        "/sandboxes/sb-1/fs",
        lambda r: httpx.Response(200, content=stored[r.url.params["path"]]),
    )
    listing = {"path": "/w", "files": [{"name": "a", "type": "file", "size": 3, "modified": 1.0}]}
    fake.on("GET", "/sandboxes/sb-1/files/list", httpx.Response(200, json=listing))
    src = tmp_path / "src.bin"
    src.write_bytes(b"\x00\xff" * 1000)
    async with client(fake) as c:
        sandbox = await c.get_sandbox("sb-1")
        await sandbox.upload_content("/w/t.txt", "héllo")
        assert await sandbox.download_content("/w/t.txt") == "héllo".encode()
        await sandbox.upload_file(src, "/w/src.bin")
        await sandbox.download_file("/w/src.bin", tmp_path / "out" / "dst.bin")
        assert [f.name for f in await sandbox.list_files("/w")] == ["a"]
    assert (tmp_path / "out" / "dst.bin").read_bytes() == src.read_bytes()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["dst.bin"]  # no temp left


async def test_a_failed_download_leaves_no_file(fake, tmp_path):
    fake.on("GET", "/sandboxes/sb-1", httpx.Response(200, json=sandbox_json()))
    fake.on(
        "GET",
        "/sandboxes/sb-1/fs",
        httpx.Response(404, json={"detail": "no", "code": "path_not_found"}),
    )
    async with client(fake) as c:
        sandbox = await c.get_sandbox("sb-1")
        with pytest.raises(errors.PathNotFound):
            await sandbox.download_file("/nope", tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


async def test_list_sandboxes_filters_by_repeated_labels(fake):
    fake.on("GET", "/sandboxes", httpx.Response(200, json={"sandboxes": [sandbox_json()]}))
    async with client(fake) as c:
        listed = await c.list_sandboxes(labels={"run": "a", "team": "b"})
    assert [s.sandbox_id for s in listed] == ["sb-1"]
    assert fake.requests[0].url.params.get_list("label") == ["run=a", "team=b"]

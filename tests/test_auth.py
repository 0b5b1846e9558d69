"""API keys: each key a tenant that sees only its own sandboxes and jobs."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from orchard_env_client import SandboxClient
from orchard_env_client.errors import AuthError, OrchardError
from orchard_env_server.backends.kubernetes.spec import TOKEN_KEY, object_name
from orchard_testing import RunningServer, kubectl

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def keyed_server(backend, tmp_path_factory):
    srv = RunningServer(
        backend=backend,
        state_dir=tmp_path_factory.mktemp("auth") / "s",
        api_keys="alice:key-a,bob:key-b",
    )
    srv.start()
    yield srv
    srv.stop()


def test_health_and_banner_need_no_key(keyed_server):
    assert httpx.get(keyed_server.url + "/health").status_code == 200
    assert httpx.get(keyed_server.url + "/").status_code == 200


@pytest.mark.parametrize("headers", [{}, {"X-API-Key": "wrong"}, {"Authorization": "Bearer wrong"}])
def test_requests_without_a_valid_key_are_401(keyed_server, headers):
    response = httpx.get(keyed_server.url + "/sandboxes", headers=headers)
    assert response.status_code == 401 and response.json()["code"] == "unauthorized"


def test_bearer_and_x_api_key_both_work(keyed_server):
    for headers in ({"X-API-Key": "key-a"}, {"Authorization": "Bearer key-a"}):
        assert httpx.get(keyed_server.url + "/sandboxes", headers=headers).status_code == 200


def test_the_client_raises_auth_error(keyed_server):
    with (
        SandboxClient(base_url=keyed_server.url, api_key="wrong") as client,
        pytest.raises(AuthError),
    ):
        client.list_sandboxes()


def test_tenants_cannot_see_or_touch_each_others_sandboxes_or_jobs(keyed_server, image):
    with (
        SandboxClient(base_url=keyed_server.url, api_key="key-a") as alice,
        SandboxClient(base_url=keyed_server.url, api_key="key-b") as bob,
    ):
        sbx = alice.create_sandbox(image)
        job = sbx.start("sleep 5")
        assert [s.sandbox_id for s in bob.list_sandboxes()] == []
        with pytest.raises(OrchardError) as err:
            bob.get_sandbox(sbx.sandbox_id)
        assert err.value.status == 404
        bob.delete_sandbox(sbx.sandbox_id)  # the client treats 404 as already gone
        assert alice.get_sandbox(sbx.sandbox_id).sandbox_id == sbx.sandbox_id
        url = keyed_server.url
        for method, path in (
            ("GET", f"/jobs/{job.job_id}"),
            ("POST", f"/jobs/{job.job_id}/cancel"),
            ("POST", f"/sandboxes/{sbx.sandbox_id}/exec"),
            ("DELETE", f"/sandboxes/{sbx.sandbox_id}"),
        ):
            response = httpx.request(
                method, url + path, headers={"X-API-Key": "key-b"}, json={"command": "true"}
            )
            assert response.status_code == 404, (path, response.text)
        assert sbx.exec("echo mine").stdout == "mine\n"


def test_keys_and_tokens_never_reach_a_sandbox(keyed_server, image):
    with SandboxClient(base_url=keyed_server.url, api_key="key-a") as alice:
        sbx = alice.create_sandbox(image)
        seen = sbx.exec("env; cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'").stdout
        assert "key-a" not in seen and "key-b" not in seen
        assert "ORCHARD_AGENT" not in seen and "ORCHARD_ENV_API_KEYS" not in seen


def test_a_query_string_key_stays_out_of_the_log(keyed_server, image):
    """The terminal route takes ``?api_key=`` (browsers' WebSockets send no headers);
    uvicorn logs a WebSocket's path with its query, so the server redacts it."""
    secret = "key-b"
    with SandboxClient(base_url=keyed_server.url, api_key=secret) as bob:
        sbx = bob.create_sandbox(image)
        url = keyed_server.url.replace("http://", "ws://")
        for name in ("api_key", "api%5Fkey"):  # the server decodes the name too
            with connect(f"{url}/sandboxes/{sbx.sandbox_id}/exec/pty?{name}={secret}") as ws:
                ws.send(json.dumps({"type": "init", "cmd": ["true"], "rows": 24, "cols": 80}))
                while json.loads(ws.recv(timeout=30))["type"] != "exit":
                    pass
        sbx.delete()
    log = Path(keyed_server.log_path).read_text()
    assert "WebSocket" in log and "api_key=***" in log
    assert secret not in log


def _agent_tokens(server: RunningServer, sandbox_id: str) -> list[str]:
    """The sandbox's agent token, read where its backend keeps it."""
    if server.backend == "kubernetes":
        path = f"jsonpath={{.data.{TOKEN_KEY}}}"
        encoded = kubectl(
            "-n", server.namespace, "get", "secret", object_name(sandbox_id), "-o", path
        )
        return [base64.b64decode(encoded).decode()]
    records = server.state_dir.rglob("record.json")
    return [json.loads(record.read_text())["agent"]["token"] for record in records]


def test_keys_and_agent_tokens_stay_out_of_a_debug_log(backend, tmp_path, image):
    """At debug level libraries log request headers (a tenant's key, the agent's token)."""
    server = RunningServer(backend=backend, state_dir=tmp_path / "s", api_keys="carol:key-c")
    server.start("--log-level", "debug")
    tokens: list[str] = []
    try:
        with SandboxClient(base_url=server.url, api_key="key-c") as carol:
            sbx = carol.create_sandbox(image)
            assert sbx.exec("echo hi").stdout == "hi\n"
            tokens = _agent_tokens(server, sbx.sandbox_id)
            url = server.url.replace("http://", "ws://")
            pty = f"{url}/sandboxes/{sbx.sandbox_id}/exec/pty?api_key=key-c"
            with connect(pty) as ws:
                ws.send(json.dumps({"type": "init", "cmd": ["true"], "rows": 24, "cols": 80}))
                while json.loads(ws.recv(timeout=30))["type"] != "exit":
                    pass
            sbx.delete()
    finally:
        server.stop()
    log = server.log()
    assert "DEBUG" in log and "key-c" not in log
    assert tokens and not any(token in log for token in tokens)

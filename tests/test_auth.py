"""API keys: each key a tenant that sees only its own sandboxes and jobs."""

from __future__ import annotations

import httpx
import pytest

from orchard_env_client import SandboxClient
from orchard_env_client.errors import AuthError, OrchardError
from orchard_testing import RunningServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def keyed_server(backend, tmp_path_factory):
    srv = RunningServer(backend=backend, state_dir=tmp_path_factory.mktemp("auth") / "s",
                        api_keys="alice:key-a,bob:key-b")  # fmt: skip
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
    with SandboxClient(base_url=keyed_server.url, api_key="key-a") as alice, \
         SandboxClient(base_url=keyed_server.url, api_key="key-b") as bob:  # fmt: skip
        sbx = alice.create_sandbox(image)
        job = sbx.start("sleep 5")
        assert [s.sandbox_id for s in bob.list_sandboxes()] == []
        with pytest.raises(OrchardError) as err:
            bob.get_sandbox(sbx.sandbox_id)
        assert err.value.status == 404
        bob.delete_sandbox(sbx.sandbox_id)  # the client treats 404 as already gone
        assert alice.get_sandbox(sbx.sandbox_id).sandbox_id == sbx.sandbox_id
        url = keyed_server.url
        for method, path in (("GET", f"/jobs/{job.job_id}"), ("POST", f"/jobs/{job.job_id}/cancel"),
                             ("POST", f"/sandboxes/{sbx.sandbox_id}/exec"),
                             ("DELETE", f"/sandboxes/{sbx.sandbox_id}")):  # fmt: skip
            response = httpx.request(method, url + path, headers={"X-API-Key": "key-b"},
                                     json={"command": "true"})  # fmt: skip
            assert response.status_code == 404, (path, response.text)
        assert sbx.exec("echo mine").stdout == "mine\n"


def test_keys_and_tokens_never_reach_a_sandbox(keyed_server, image):
    with SandboxClient(base_url=keyed_server.url, api_key="key-a") as alice:
        sbx = alice.create_sandbox(image)
        seen = sbx.exec("env; cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'").stdout
        assert "key-a" not in seen and "key-b" not in seen
        assert "ORCHARD_AGENT" not in seen and "ORCHARD_ENV_API_KEYS" not in seen

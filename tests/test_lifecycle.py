"""Lifecycle: create, list, wait, heartbeat, delete, TTL, idle expiry, restarts."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from orchard_env_client import SandboxClient
from orchard_env_client.errors import OrchardError
from orchard_testing import (
    backend_is_slow,
    create_ready,
    leftovers,
    only_backend,
    wait_until_it_runs_again,
)

pytestmark = pytest.mark.integration


def test_create_answers_a_sandbox_object_that_becomes_ready(server, image):
    body = {"image": image, "labels": {"a": "1"}}
    response = httpx.post(f"{server.url}/sandboxes", json=body, timeout=60)
    assert response.status_code == 201
    body = response.json()
    # The create call waits up to half a second for readiness: pods take longer, and so
    # does a container on a loaded machine; then the answer is `pending`.
    assert body["status"] in ("pending", "ready")
    if body["status"] == "pending":
        waited = httpx.get(f"{server.url}/sandboxes/{body['sandbox_id']}/wait", timeout=90)
        body = waited.json()
    assert body["status"] == "ready" and body["labels"] == {"a": "1"}
    expected = {
        "sandbox_id",
        "image",
        "status",
        "block_network",
        "cpu",
        "memory",
        "timeout",
        "created_at",
        "labels",
        "ttl_seconds",
        "idle_timeout_seconds",
        "expires_at",
        "error",
    }
    assert expected <= set(body)
    sid = body["sandbox_id"]
    assert (
        httpx.get(f"{server.url}/sandboxes/{sid}/wait", params={"timeout": 5}).json()["status"]
        == "ready"
    )
    assert httpx.delete(f"{server.url}/sandboxes/{sid}").json() == {
        "status": "deleted",
        "sandbox_id": sid,
    }
    assert httpx.delete(f"{server.url}/sandboxes/{sid}").status_code == 404


def test_a_custom_id_is_used_and_cannot_be_taken_twice(server, image):
    with SandboxClient(base_url=server.url) as client:
        sbx = client.create_sandbox(image, sandbox_id="my-custom-id")
        assert sbx.sandbox_id == "my-custom-id"
        response = httpx.post(
            f"{server.url}/sandboxes", json={"image": image, "sandbox_id": "my-custom-id"}
        )
        assert response.status_code == 409 and response.json()["code"]


def test_labels_filter_the_list(server, image):
    with SandboxClient(base_url=server.url) as client:
        a = client.create_sandbox(image, labels={"run": "exp-1"})
        client.create_sandbox(image, labels={"run": "exp-2"})
        listed = client.list_sandboxes(labels={"run": "exp-1"})
        assert [s.sandbox_id for s in listed] == [a.sandbox_id]


def test_a_sandbox_is_not_idle_while_a_long_command_runs_in_it(server, image):
    with SandboxClient(base_url=server.url) as client:
        sbx = client.create_sandbox(image, idle_timeout_seconds=2)
        job = sbx.exec("sleep 4; echo slept", timeout=30)
        assert job.status == "succeeded" and job.stdout == "slept\n", job
        assert sbx.refresh().status == "ready"
        sbx.delete()


def test_a_sandbox_is_deleted_when_its_ttl_runs_out(server, image):
    # The ttl counts from the create call, so it must outlast the wait for ready: a pod
    # takes 2-5 s here, up to ~10 s on a machine the rest of the suite loads.
    ttl = 15.0 if backend_is_slow(server) else 1.5
    with SandboxClient(base_url=server.url) as client:
        sbx = client.create_sandbox(image, ttl_seconds=ttl)
        assert sbx.info.expires_at == pytest.approx(sbx.info.created_at + ttl)
        time.sleep(max(0.0, sbx.info.expires_at - time.time()) + 2.5)
        with pytest.raises(OrchardError) as err:
            client.get_sandbox(sbx.sandbox_id)
        assert err.value.status == 404


def test_idle_sandboxes_are_deleted_but_heartbeats_keep_them(server, image):
    with SandboxClient(base_url=server.url) as client:
        idle = client.create_sandbox(image, idle_timeout_seconds=2)
        kept = client.create_sandbox(image, idle_timeout_seconds=2)
        for _ in range(5):
            time.sleep(0.8)
            kept.heartbeat()
        assert client.get_sandbox(kept.sandbox_id).sandbox_id == kept.sandbox_id
        with pytest.raises(OrchardError):
            client.get_sandbox(idle.sandbox_id)


def test_a_bad_image_fails_with_a_reason(server):
    if server.backend == "local":  # the local backend knows at once: nothing is made
        missing = f"{server.state_dir.parent}/no/such/rootfs"  # where test servers allow trees
        answer = httpx.post(f"{server.url}/sandboxes", json={"image": missing})
        assert answer.status_code == 404, answer.text
        assert answer.json()["code"] == "image_not_found"
        assert missing in answer.json()["detail"]
        answer = httpx.post(f"{server.url}/sandboxes", json={"image": "no-such/image:1"})
        assert answer.status_code == 404 and "orchard-env image pull" in answer.json()["detail"]
        listed = httpx.get(f"{server.url}/sandboxes").text
        assert "/no/such/rootfs" not in listed and "no-such/image" not in listed
        return
    body = create_ready(server.url, {"image": "/no/such/rootfs"})
    assert body["status"] == "failed" and "no/such/rootfs" in body["error"]


def test_a_killed_orchestrator_finds_its_sandboxes_again(fresh_server, image):
    fresh_server.start()
    with SandboxClient(base_url=fresh_server.url, auto_cleanup=False) as client:
        sbx = client.create_sandbox(image)
        sbx.exec("echo kept > /workspace/proof.txt")
    fresh_server.kill()
    fresh_server.start()
    with SandboxClient(base_url=fresh_server.url) as client:
        again = client.get_sandbox(sbx.sandbox_id)
        assert again.exec("cat /workspace/proof.txt").stdout == "kept\n"
        again.delete()
    fresh_server.stop()
    assert leftovers(fresh_server) == []


def test_a_graceful_stop_leaves_no_process_or_directory_behind(fresh_server, image):
    fresh_server.start()
    with SandboxClient(base_url=fresh_server.url, auto_cleanup=False) as client:
        for _ in range(3):
            client.create_sandbox(image).start("sleep 300")
    fresh_server.stop()
    assert leftovers(fresh_server) == []


@only_backend("local")  # the one backend whose removal outlasts the delete (retire, reap)
def test_deleted_sandboxes_stay_deleted_and_leave_nothing_even_if_the_server_dies(
    fresh_server, image
):
    """Delete answers before the removal is over (it continues in the background); a
    server killed right after its answers still removes them all when it starts again,
    and an id may be taken again at once."""
    fresh_server.start()
    with SandboxClient(base_url=fresh_server.url, auto_cleanup=False) as client:
        sandboxes = [client.create_sandbox(image) for _ in range(6)]
        for sbx in sandboxes:
            sbx.start("sleep 300")
        reused = sandboxes[0].sandbox_id
        sandboxes[0].delete()
        again = client.create_sandbox(image, sandbox_id=reused)
        assert again.exec("echo fresh").stdout == "fresh\n"
        again.delete()
        for sbx in sandboxes[1:]:
            sbx.delete()
    fresh_server.kill()
    fresh_server.start()
    with SandboxClient(base_url=fresh_server.url) as client:
        assert client.list_sandboxes() == []
        deadline = time.monotonic() + 60
        while client.resources()["sandboxes_reaping"] and time.monotonic() < deadline:
            time.sleep(0.1)
    fresh_server.stop()
    assert leftovers(fresh_server) == []


@only_backend("local")  # the shared agent is the local backend's; Docker: test_docker.py
def test_sandboxes_of_a_dead_agent_are_cleaned_or_served_again(fresh_server, image):
    fresh_server.start()
    with SandboxClient(base_url=fresh_server.url) as client:
        sbx = client.create_sandbox(image)
        agent_pid = json.loads((fresh_server.state_dir / "agent.json").read_text())["pid"]
        os.kill(agent_pid, signal.SIGKILL)
        # A command sent while the agent is down fails (a lost job); then it is back.
        wait_until_it_runs_again(sbx, seconds=15)


def test_resources_name_the_backend_and_count_running_sandboxes(server, image):
    with SandboxClient(base_url=server.url) as client:
        client.create_sandbox(image)
        resources = client.resources()
    assert resources["backend"] == server.backend
    assert resources["sandboxes_running"] >= 1 and resources["sandboxes_known"] >= 1
    assert resources["cpu_count"] >= 1 and resources["memory_total_bytes"] > 0

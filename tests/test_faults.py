"""Faults: an agent killed mid-command, an orchestrator killed mid-run, the engine restarted.

Each ends in a clear answer, never a hang or a bare 404: a job whose agent died is
``failed`` with the reason; sandboxes of a restarted orchestrator are adopted, or come back
``failed`` with the reason when they died meanwhile; a Docker engine that is down makes
creates answer 503 (with Retry-After) until it is back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

import orchard_env_agent
from orchard_env_client import SandboxClient
from orchard_testing import agent_pid, create_ready, kubectl, only_backend, wait_until_it_runs_again

pytestmark = [pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[1]


def wait_status(url: str, sandbox_id: str, want: str, seconds: float) -> dict[str, object]:
    deadline = time.monotonic() + seconds
    while True:
        body: dict[str, object] = httpx.get(f"{url}/sandboxes/{sandbox_id}", timeout=10).json()
        if body.get("status") == want or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


def test_an_agent_killed_mid_command_fails_the_job_with_a_reason(fresh_server, image):
    fresh_server.start()
    url = fresh_server.url
    sid = str(create_ready(url, {"image": image})["sandbox_id"])
    background = httpx.post(
        f"{url}/sandboxes/{sid}/exec", json={"command": "sleep 60"}, timeout=30
    ).json()
    waited: dict[str, object] = {}

    def run_waited() -> None:
        response = httpx.post(
            f"{url}/sandboxes/{sid}/exec",
            json={"command": "sleep 60; echo never", "wait": True},
            timeout=120,
        )
        waited.update(status_code=response.status_code, body=response.json())

    thread = threading.Thread(target=run_waited)
    thread.start()
    time.sleep(1.0)  # both commands are running
    started = time.monotonic()
    os.kill(agent_pid(fresh_server, sid), signal.SIGKILL)
    thread.join(timeout=30)
    assert not thread.is_alive(), "the waited exec hung after its agent died"
    assert time.monotonic() - started < 30

    assert waited["status_code"] == 200, waited
    job = waited["body"]
    assert isinstance(job, dict)
    assert job["status"] == "failed" and job["exit_code"] is None
    assert job["job_id"].startswith(sid + ".")
    assert "agent went away" in job["error"] and "lost" in job["error"]

    lost = httpx.get(f"{url}/jobs/{background['job_id']}/wait", params={"timeout": 30}, timeout=60)
    assert lost.status_code == 200, lost.text
    assert lost.json()["status"] == "failed" and "lost" in lost.json()["error"]
    # Asking again gives the same answer, not a 404.
    again = httpx.get(f"{url}/jobs/{background['job_id']}", timeout=30).json()
    assert again["status"] == "failed" and again["error"] == lost.json()["error"]

    if fresh_server.backend == "local":
        # One agent serves every local sandbox: it is restarted and the sandbox (its
        # namespaces and files are intact) serves again.
        with SandboxClient(base_url=url, auto_cleanup=False) as client:
            wait_until_it_runs_again(client.get_sandbox(sid), seconds=20)
    else:
        # The agent is the sandbox's main process: the sandbox is failed, with the reason.
        body = wait_status(url, sid, "failed", 60)
        assert body["status"] == "failed" and body["error"], body
        response = httpx.post(f"{url}/sandboxes/{sid}/exec", json={"command": "true"})
        assert response.status_code == 409 and response.json()["code"] == "sandbox_not_ready"


def test_a_stream_whose_agent_dies_still_ends_with_a_failed_exit_event(fresh_server, image):
    fresh_server.start()
    url = fresh_server.url
    sid = str(create_ready(url, {"image": image})["sandbox_id"])
    events: list[dict[str, object]] = []
    body = {"command": "echo first; sleep 60"}
    with httpx.stream(
        "POST", f"{url}/sandboxes/{sid}/exec/stream", json=body, timeout=120
    ) as response:
        for line in response.iter_lines():
            if not line:
                continue
            events.append(json.loads(line))
            if events[-1].get("data") == "first\n":
                os.kill(agent_pid(fresh_server, sid), signal.SIGKILL)
    assert events[0] == {"type": "stdout", "data": "first\n"}
    assert events[-1]["type"] == "exit" and events[-1]["status"] == "failed"
    assert "lost" in str(events[-1]["error"])


def test_jobs_survive_an_orchestrator_killed_mid_run(fresh_server, image):
    fresh_server.start()
    url = fresh_server.url
    sid = str(create_ready(url, {"image": image})["sandbox_id"])
    job = httpx.post(
        f"{url}/sandboxes/{sid}/exec", json={"command": "sleep 2; echo finished"}, timeout=30
    ).json()
    fresh_server.kill()
    fresh_server.start()
    done = httpx.get(f"{url}/jobs/{job['job_id']}/wait", params={"timeout": 60}, timeout=90)
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "succeeded" and done.json()["stdout"] == "finished\n"
    httpx.delete(f"{url}/sandboxes/{sid}", timeout=60)


@only_backend("local")  # local holders and Docker containers die alike; one is enough here
def test_a_sandbox_that_died_while_the_orchestrator_was_down_comes_back_failed(fresh_server):
    fresh_server.start()
    url = fresh_server.url
    sid = str(create_ready(url, {"image": "host"})["sandbox_id"])
    job = httpx.post(f"{url}/sandboxes/{sid}/exec", json={"command": "sleep 60"}).json()
    record = json.loads((fresh_server.state_dir / "sandboxes" / sid / "record.json").read_text())
    fresh_server.kill()
    os.kill(record["backend_state"]["holder_pid"], signal.SIGKILL)
    fresh_server.start()
    body = httpx.get(f"{url}/sandboxes/{sid}").json()
    assert body["status"] == "failed" and "orchestrator was down" in body["error"]
    response = httpx.get(f"{url}/jobs/{job['job_id']}")
    assert response.status_code == 409 and "orchestrator was down" in response.json()["detail"]
    assert not (fresh_server.state_dir / "sandboxes" / sid).exists()


def _dockerd_pid() -> int:
    pidfile = (
        Path(os.environ.get("ORCHARD_DOCKERD_DIR", "/var/tmp/orchard-dockerd")) / "dockerd.pid"
    )
    return int(pidfile.read_text())


def _cluster_node_ready(seconds: float) -> None:
    """After an engine restart, wait until the test cluster's kubelet has recovered."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            status = kubectl(
                "get",
                "nodes",
                "-o",
                "jsonpath={.items[0].status.conditions[?(@.type=='Ready')].status}",
            )
        except (OSError, RuntimeError, KeyError, subprocess.TimeoutExpired):
            return  # no test cluster on this machine
        if status == "True":
            return
        time.sleep(1)


@only_backend("docker")
def test_a_docker_engine_restart_is_reported_as_503_and_recovered_from(fresh_server, image):
    fresh_server.start()
    url = fresh_server.url
    sid = str(create_ready(url, {"image": image})["sandbox_id"])
    pid = _dockerd_pid()
    os.kill(pid, signal.SIGTERM)
    try:
        deadline = time.monotonic() + 60
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        response = httpx.post(f"{url}/sandboxes", json={"image": image}, timeout=60)
        assert response.status_code == 503, response.text
        assert response.json()["code"] == "backend_unavailable"
        assert response.headers["retry-after"]
        assert httpx.get(f"{url}/sandboxes").json()["sandboxes"] == [
            httpx.get(f"{url}/sandboxes/{sid}").json()
        ], "the refused create left a record behind"
        resources = httpx.get(f"{url}/resources", timeout=30)
        assert resources.status_code == 503 and resources.json()["code"] == "backend_unavailable"
    finally:
        subprocess.run(["bash", str(ROOT / "infra/docker/up")], check=True, timeout=120)
    # The old sandbox's container stopped with the engine: it is failed, with a reason.
    body = wait_status(url, sid, "failed", 60)
    assert body["status"] == "failed" and body["error"], body
    # And the service works again.
    deadline = time.monotonic() + 60
    while True:
        created = create_ready(url, {"image": image})
        if created.get("status") == "ready" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert created["status"] == "ready", created
    ran = httpx.post(
        f"{url}/sandboxes/{created['sandbox_id']}/exec",
        json={"command": "echo again", "wait": True},
        timeout=60,
    ).json()
    assert ran["stdout"] == "again\n"
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok"
    _cluster_node_ready(120)


def _ended(pid: int) -> bool:
    """Gone, or a zombie (its parent, not the test, reaps it)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@only_backend("local")  # the one backend whose agent outlives the orchestrator's process
def test_an_adopted_agent_of_older_code_is_replaced_unless_commands_run_in_it(
    fresh_server, tmp_path
):
    """After an upgrade the restarted orchestrator finds the agent the old code started.
    The upgrade is a copy of the agent package with one change, first on PYTHONPATH."""
    upgraded = tmp_path / "upgraded"
    shutil.copytree(
        Path(orchard_env_agent.__file__).parent,
        upgraded / "orchard_env_agent",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    with open(upgraded / "orchard_env_agent" / "build.py", "a") as fh:
        fh.write("\n# the upgrade\n")
    fresh_server.start()
    url = fresh_server.url
    sid = str(create_ready(url, {"image": "host"})["sandbox_id"])
    old_pid = agent_pid(fresh_server, sid)
    job = httpx.post(f"{url}/sandboxes/{sid}/exec", json={"command": "sleep 60"}).json()

    fresh_server.kill()
    fresh_server.env = {"PYTHONPATH": str(upgraded)}
    fresh_server.start()  # a command runs in the old agent: it is kept, and /health says so
    warnings = httpx.get(f"{url}/health").json()["warnings"]
    assert any("before an upgrade" in w and "(1 now)" in w for w in warnings), warnings
    assert agent_pid(fresh_server, sid) == old_pid
    assert httpx.get(f"{url}/jobs/{job['job_id']}").json()["status"] == "running"
    httpx.post(f"{url}/jobs/{job['job_id']}/cancel").raise_for_status()

    fresh_server.kill()
    fresh_server.start()  # nothing runs in it now: replaced, and the sandbox is served on
    assert not [w for w in httpx.get(f"{url}/health").json()["warnings"] if "upgrade" in w]
    new_pid = agent_pid(fresh_server, sid)
    assert new_pid != old_pid and _ended(old_pid)
    assert psutil.Process(new_pid).environ().get("PYTHONPATH") == str(upgraded)
    done = httpx.post(f"{url}/sandboxes/{sid}/exec", json={"command": "echo served", "wait": True})
    assert done.json()["stdout"] == "served\n", done.text
    httpx.delete(f"{url}/sandboxes/{sid}", timeout=60)

"""Exec, jobs, streaming, auth and bad input against a real agent process."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from agent_harness import Agent

pytestmark = pytest.mark.integration


def test_health(single: Agent) -> None:
    from orchard_env_agent.build import build_id

    r = single.client.get("/health")
    assert r.json() == {
        "status": "ok",
        "version": "0.1.0",
        "mode": "single",
        "sandboxes": 1,
        "build": build_id(),
        "jobs_running": 0,
    }


def test_exit_stderr_cwd_env(single: Agent) -> None:
    j = single.exec("echo out; echo err >&2; pwd; echo $FOO; exit 3", env={"FOO": "bar"})
    assert j["status"] == "failed" and j["exit_code"] == 3
    assert j["stdout"] == f"out\n{single.workdir}\nbar\n"
    assert j["stderr"] == "err\n"
    assert j["job_id"].startswith("sb-single.")
    assert j["usage"]["cpu_user_s"] >= 0 and j["usage"]["max_rss_bytes"] > 0
    assert j["timed_out"] is False and j["error"] is None
    j = single.exec(["pwd"], cwd="/tmp")
    assert j["status"] == "succeeded" and j["stdout"] == "/tmp\n"


def test_stdin_unicode_binary(single: Agent) -> None:
    j = single.exec(["cat"], stdin="héllo ✓ 日本\n" * 3)
    assert j["stdout"] == "héllo ✓ 日本\n" * 3
    j = single.exec("printf '\\xff\\xfeok\\x80'")
    assert j["stdout"] == "\ufffd\ufffdok\ufffd"
    big = "x" * 300_000
    j = single.exec("wc -c", stdin=big)
    assert j["stdout"].strip() == "300000"


def test_missing_executable(single: Agent) -> None:
    j = single.exec(["definitely-not-a-command-xyz"])
    assert j["status"] == "failed" and j["exit_code"] == 127
    assert "not found" in j["stderr"]
    j = single.exec("definitely-not-a-command-xyz")
    assert j["exit_code"] == 127


def test_login_shell_and_bad_cwd(single: Agent) -> None:
    assert single.exec("echo ok", login_shell=True)["stdout"] == "ok\n"
    j = single.exec("true", cwd="/no/such/dir")
    assert j["status"] == "failed" and "cwd" in j["error"]


def test_timeout_kills_group(single: Agent) -> None:
    marker = f"sleep 4{os.getpid() % 100}.5"
    t0 = time.monotonic()
    j = single.exec(f"echo before; {marker} & echo $! ; sleep 30", timeout_seconds=1)
    assert time.monotonic() - t0 < 10
    assert j["timed_out"] is True and j["status"] == "failed" and j["exit_code"] is None
    assert j["stdout"].startswith("before\n")
    assert "timed out" in j["error"]
    bg = int(j["stdout"].split()[1])
    time.sleep(0.2)
    stat = Path(f"/proc/{bg}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z"


def test_async_job_wait_cancel(single: Agent) -> None:
    h = single.headers()
    r = single.client.post("/exec", json={"command": "echo hi; sleep 30"}, headers=h)
    assert r.json()["status"] == "queued"
    jid = r.json()["job_id"]
    j = single.client.get(f"/jobs/{jid}/wait", params={"timeout": 0.3}, headers=h).json()
    assert j["status"] == "running" and j["completed_at"] is None
    j = single.client.post(f"/jobs/{jid}/cancel", headers=h).json()
    assert j["status"] == "failed" and j["exit_code"] is None and "cancel" in j["error"]
    assert j["stdout"] == "hi\n"
    assert single.client.get(f"/jobs/{jid}", headers=h).json()["status"] == "failed"
    r = single.client.get("/jobs/sb-single.nope", headers=h)
    assert r.status_code == 404 and r.json()["code"] == "job_not_found"


def test_stream_order(single: Agent) -> None:
    body = {"command": "for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.05; done; exit 2"}
    with single.client.stream("POST", "/exec/stream", json=body, headers=single.headers()) as r:
        events = [json.loads(line) for line in r.iter_lines() if line]
    out = "".join(e["data"] for e in events if e["type"] == "stdout")
    err = "".join(e["data"] for e in events if e["type"] == "stderr")
    assert out == "o1\no2\no3\n" and err == "e1\ne2\ne3\n"
    assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 2
    assert events[-1]["stdout"] == out
    kinds = [e["type"] for e in events[:-1]]
    assert kinds.index("stdout") < len(kinds) and "exit" not in kinds


def test_stream_disconnect_kills(single: Agent) -> None:
    body = {"command": "echo $$; exec sleep 60"}
    with single.client.stream("POST", "/exec/stream", json=body, headers=single.headers()) as r:
        first = json.loads(next(r.iter_lines()))
    pid = int(first["data"])
    for _ in range(50):
        if not os.path.exists(f"/proc/{pid}"):
            break
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")


def test_truncation(single: Agent) -> None:  # the fixture's cap is 4096 bytes
    j = single.exec("seq 1 100000; seq 1 10 >&2")
    assert j["stdout_truncated"] is True and j["stderr_truncated"] is False
    assert j["stdout"].startswith("1\n2\n3\n") and j["stdout"].endswith("99999\n100000\n")
    assert "truncated" in j["stdout"] and len(j["stdout"]) < 4300


def test_concurrent_not_serialised(single: Agent) -> None:
    import concurrent.futures

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        list(pool.map(lambda _: single.exec("sleep 1"), range(5)))
    assert time.monotonic() - t0 < 3


def test_auth_and_errors(single: Agent) -> None:
    r = single.client.post("/exec", json={"command": "true"})
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    r = single.client.post(
        "/exec", json={"command": "true"}, headers={"Authorization": "Bearer no"}
    )
    assert r.status_code == 401
    h = single.headers()
    for body in [b"{", b'{"command": 5}', b'{"command": "x", "extra": 1}', b'"str"']:
        r = single.client.post("/exec", content=body, headers=h)
        assert r.status_code == 422 and r.json()["code"] == "invalid_body", body
    r = single.client.get("/nope", headers={**h, "X-Request-ID": "abc"})
    assert r.status_code == 404 and r.json()["code"] and r.headers["x-request-id"] == "abc"
    r = single.client.post(
        "/exec", json={"command": "true"}, headers={**h, "X-Orchard-Sandbox": "other"}
    )
    assert r.status_code == 404 and r.json()["code"] == "sandbox_not_found"


def test_multi_admin(multi: Agent) -> None:
    j = multi.exec("pwd; echo $HOME")
    assert j["stdout"] == f"{multi.workdir}\n{multi.workdir}\n" and j["job_id"].startswith(
        "sb-multi."
    )
    listing = multi.admin("GET", "/_admin/sandboxes").json()
    assert {"sandbox_id": "sb-multi", "running_jobs": 0} in listing["sandboxes"]
    r = multi.client.post(
        "/exec",
        json={"command": "true"},
        headers={"Authorization": f"Bearer {multi.token}", "X-Orchard-Sandbox": "zzz"},
    )
    assert r.status_code == 404 and r.json()["code"] == "sandbox_not_found"
    assert (
        multi.admin(
            "GET",
            "/_admin/sandboxes",
        ).status_code
        == 200
    )
    r = multi.client.get("/_admin/sandboxes", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    r = multi.admin("POST", "/_admin/sandboxes", json={"sandbox_id": "x", "token": "t", "bogus": 1})
    assert r.status_code == 422
    # register, run a long job, delete: the job is killed
    body = {"sandbox_id": "tmp-sb", "token": "tt", "workdir": "/", "mounts": []}
    assert multi.admin("POST", "/_admin/sandboxes", json=body).status_code == 201
    h = {"Authorization": "Bearer tt", "X-Orchard-Sandbox": "tmp-sb"}
    jid = multi.client.post("/exec", json={"command": "sleep 60"}, headers=h).json()["job_id"]
    assert multi.admin("DELETE", "/_admin/sandboxes/tmp-sb").status_code == 200
    assert multi.admin("DELETE", "/_admin/sandboxes/tmp-sb").status_code == 404
    assert multi.client.get(f"/jobs/{jid}", headers=h).status_code == 404


def test_a_job_dropped_for_newer_results_says_so_and_its_id_stays_taken(single: Agent) -> None:
    from orchard_env_agent.jobs import MAX_FINISHED

    h = single.headers()
    first = single.exec(["true"])["job_id"]
    for _ in range(MAX_FINISHED):
        single.exec(["true"])
    r = single.client.get(f"/jobs/{first}", headers=h)
    assert r.status_code == 404 and r.json()["code"] == "job_evicted", r.text
    assert "finished" in r.json()["detail"] and str(MAX_FINISHED) in r.json()["detail"]
    again = single.client.post("/exec", json={"command": ["true"], "job_id": first}, headers=h)
    assert again.status_code == 409, again.text
    r = single.client.get(f"/jobs/{single.sandbox_id}.0123456789abcdef", headers=h)
    assert r.status_code == 404 and r.json()["code"] == "job_not_found"

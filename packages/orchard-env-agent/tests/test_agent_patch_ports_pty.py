"""apply_patch, port forwarding and the PTY against a real agent process."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from agent_harness import Agent, free_port, http_server_inside
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

pytestmark = pytest.mark.integration

LINES = [f"line {i}" for i in range(1, 21)]


def _repo(root: Path, name: str, commit: bool = True) -> Path:
    d = root / name
    d.mkdir()
    (d / "f.txt").write_text("\n".join(LINES) + "\n")
    if commit:
        env = {
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "PATH": "/usr/bin:/bin",
        }
        for cmd in (["git", "init", "-q"], ["git", "add", "."], ["git", "commit", "-qm", "v1"]):
            subprocess.run(cmd, cwd=d, check=True, env=env)
    return d


def _diff(d: Path) -> str:
    new = list(LINES)
    new[9] = "line 10 CHANGED"
    (d / "f.new").write_text("\n".join(new) + "\n")
    out = subprocess.run(
        ["git", "diff", "--no-index", "f.txt", "f.new"], cwd=d, capture_output=True, text=True
    ).stdout
    (d / "f.new").unlink()
    return out.replace("a/f.new", "a/f.txt").replace("b/f.new", "b/f.txt")


def _patch(agent: Agent, d: Path, patch: str) -> dict:
    cwd_body = {"patch": patch, "timeout_seconds": 30}
    # apply_patch runs in the sandbox workdir: use a dedicated sandbox rooted at d
    r = agent.client.post("/apply_patch", json=cwd_body, headers=agent.headers())
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def patch_agent(multi: Agent, tmp_path: Path):
    def make(d: Path) -> Agent:
        body = {
            "sandbox_id": "patchsb",
            "token": "pt",
            "workdir": str(d),
            "env": {"PATH": "/usr/bin:/bin"},
            "mounts": [{"path": "/", "host_path": "/", "writable": True}],
        }
        assert multi.admin("POST", "/_admin/sandboxes", json=body).status_code == 201
        return Agent(
            multi.proc, multi.base_url, "pt", d, "patchsb", multi.client, multi.admin_token
        )

    yield make
    multi.admin("DELETE", "/_admin/sandboxes/patchsb")


def test_patch_clean(patch_agent, tmp_path: Path) -> None:
    d = _repo(tmp_path, "clean")
    res = _patch(patch_agent(d), d, _diff(d))
    assert res["success"] is True and res["exit_code"] == 0 and res["method"] == "git apply"
    assert "line 10 CHANGED" in (d / "f.txt").read_text()


def test_patch_three_way(patch_agent, tmp_path: Path) -> None:
    d = _repo(tmp_path, "threeway")
    patch = _diff(d)
    text = (d / "f.txt").read_text().replace("line 7\n", "line 7 LOCAL\n")
    (d / "f.txt").write_text(text)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "v2"],
        cwd=d,
        check=True,
    )
    res = _patch(patch_agent(d), d, patch)
    assert res["success"] is True and res["method"] == "git apply --3way", res
    t = (d / "f.txt").read_text()
    assert "line 7 LOCAL" in t and "line 10 CHANGED" in t


def test_patch_fuzz(patch_agent, tmp_path: Path) -> None:
    d = _repo(tmp_path, "fuzz")
    patch = "\n".join(ln for ln in _diff(d).splitlines() if not ln.startswith("index ")) + "\n"
    subprocess.run(["rm", "-rf", ".git"], cwd=d, check=True)
    (d / "f.txt").write_text((d / "f.txt").read_text().replace("line 7\n", "line 7 LOCAL\n"))
    res = _patch(patch_agent(d), d, patch)
    assert res["success"] is True and res["method"].startswith("patch"), res
    assert "line 10 CHANGED" in (d / "f.txt").read_text()


def test_patch_failure(patch_agent, tmp_path: Path) -> None:
    d = _repo(tmp_path, "fail")
    patch = _diff(d)
    (d / "f.txt").write_text("something else entirely\n")
    res = _patch(patch_agent(d), d, patch)
    assert res["success"] is False and res["exit_code"] not in (0, None)
    assert res["stdout"] or res["stderr"]
    assert (d / "f.txt").read_text() == "something else entirely\n"


def test_ports(single: Agent) -> None:
    h = single.headers()
    port = free_port()
    (single.workdir / "served").mkdir()
    (single.workdir / "served" / "hello.txt").write_text("hello from inside")
    r = single.client.get(f"/ports/{port}/hello.txt", headers=h)
    assert r.status_code == 502 and r.json()["code"] == "port_not_listening"
    with http_server_inside(single, port, "/hello.txt", directory="served") as r:
        assert r.status_code == 200 and r.text == "hello from inside"
        r = single.client.get(f"/ports/{port}/missing", headers=h)
        assert r.status_code == 404


def test_pty_echo(single: Agent) -> None:
    url = single.base_url.replace("http", "ws") + "/exec/pty?cols=100&rows=30"
    with connect(url, additional_headers=single.headers()) as ws:
        ws.send(json.dumps({"type": "resize", "cols": 120, "rows": 40}))
        ws.send(b"stty size; echo pty-$((6*7)); tty\n")
        buf = b""
        deadline = time.monotonic() + 10
        while b"pty-42" not in buf or b"40 120" not in buf:
            assert time.monotonic() < deadline, buf
            msg = ws.recv(timeout=10)
            buf += msg if isinstance(msg, bytes) else msg.encode()
        assert b"/dev/pts/" in buf or b"not a tty" not in buf
        ws.send(b"exit\n")


def test_pty_auth(single: Agent) -> None:
    url = single.base_url.replace("http", "ws") + "/exec/pty"
    with pytest.raises(InvalidStatus), connect(url) as ws:
        ws.recv(timeout=5)


def test_files_through_http(single: Agent) -> None:  # sanity: base64 of an empty file
    h = single.headers()
    r = httpx.post(single.base_url + "/files", json={"path": "empty", "content": ""}, headers=h)
    assert r.json()["size"] == 0
    r = httpx.get(single.base_url + "/files", params={"path": "empty"}, headers=h)
    assert base64.b64decode(r.json()["content"]) == b""

"""Helpers that start the real agent as a subprocess (single and multi mode)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class Agent:
    proc: subprocess.Popen[bytes]
    base_url: str
    token: str
    workdir: Path
    sandbox_id: str
    client: httpx.Client
    admin_token: str | None = None

    def headers(self) -> dict[str, str]:
        h = {"Authorization": f"Bearer {self.token}"}
        if self.admin_token:
            h["X-Orchard-Sandbox"] = self.sandbox_id
        return h

    def exec(self, command: object, **kw: object) -> dict:
        body = {"command": command, "wait": True, **kw}
        r = self.client.post("/exec", json=body, headers=self.headers())
        assert r.status_code == 200, r.text
        return r.json()

    def admin(self, method: str, path: str, **kw: object) -> httpx.Response:
        return self.client.request(
            method, path, headers={"Authorization": f"Bearer {self.admin_token}"}, **kw
        )


def start_agent(tmp: Path, *, multi: bool, extra: list[str] | None = None) -> Agent:
    tmp.mkdir(parents=True, exist_ok=True)
    port_file = tmp / "port"
    workdir = tmp / "work"
    workdir.mkdir(exist_ok=True)
    token = secrets.token_hex(8)
    env = dict(os.environ)
    args = [sys.executable, "-m", "orchard_env_agent", "--port", "0", "--port-file", str(port_file)]
    admin_token = None
    if multi:
        admin_token = secrets.token_hex(8)
        (tmp / "admin").write_text(admin_token)
        args += ["--multi", "--admin-token-file", str(tmp / "admin")]
    else:
        env.update(
            ORCHARD_SANDBOX_ID="sb-single", ORCHARD_AGENT_TOKEN=token, ORCHARD_WORKDIR=str(workdir)
        )
    args += extra or []
    log = open(tmp / "agent.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=log, cwd=str(workdir))
    deadline = time.monotonic() + 15
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((tmp / "agent.log").read_text())
        time.sleep(0.02)
    base = f"http://127.0.0.1:{int(port_file.read_text())}"
    client = httpx.Client(base_url=base, timeout=60)
    while True:
        try:
            client.get("/health")
            break
        except httpx.TransportError:
            time.sleep(0.02)
    agent = Agent(proc, base, token, workdir, "sb-single", client, admin_token)
    if multi:
        agent.sandbox_id = "sb-multi"
        r = agent.admin(
            "POST",
            "/_admin/sandboxes",
            json={
                "sandbox_id": "sb-multi",
                "token": token,
                "env": {"PATH": os.environ["PATH"], "HOME": str(workdir)},
                "workdir": str(workdir),
                "holder_pid": None,
                "mounts": [
                    {"path": "/workspace", "host_path": str(workdir), "writable": True},
                    {"path": "/ro", "host_path": str(tmp), "writable": False},
                    {"path": str(workdir), "host_path": str(workdir), "writable": True},
                ],
            },
        )
        assert r.status_code == 201, r.text
    return agent


def stop_agent(agent: Agent) -> None:
    agent.client.close()
    agent.proc.terminate()
    try:
        agent.proc.wait(10)
    except subprocess.TimeoutExpired:
        agent.proc.kill()
        agent.proc.wait()


def free_port() -> int:
    """A TCP port nothing on the host's loopback listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def http_server_inside(
    agent: Agent, port: int, path: str, directory: str = "."
) -> Iterator[httpx.Response]:
    """Run ``python3 -m http.server`` inside the sandbox; yield the first answer for ``path``
    reached through ``/ports`` (the server is killed on exit)."""
    h = agent.headers()
    job = agent.client.post(
        "/exec",
        headers=h,
        json={
            "command": f"exec python3 -m http.server {port} --bind 127.0.0.1 --directory {directory}",
            "timeout_seconds": 60,
        },
    ).json()
    try:
        for _ in range(100):
            r = agent.client.get(f"/ports/{port}{path}", params={"q": "1"}, headers=h)
            if r.status_code != 502:
                break
            time.sleep(0.05)
        yield r
    finally:
        agent.client.post(f"/jobs/{job['job_id']}/cancel", headers=h)


SKIP = {"proc", "dev", "sys", "tmp", "workspace"}


def start_holder(ws: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A bubblewrap holder like the local backend's, with ``ws`` as /workspace: a user
    namespace of its own (orchard-enter refuses holders without one), here mapping the
    caller's uid as root; the orchestrator's (unprivileged ranges, seccomp, staged
    sources) are tested in tests/test_isolation.py and tests/security/."""
    args = ["bwrap", "--tmpfs", "/"]
    for entry in sorted(os.listdir("/")):
        if entry in SKIP:
            continue
        path = f"/{entry}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    info = ws.parent / "bwrap-info.json"
    fh = open(info, "wb")  # noqa: SIM115
    w = fh.fileno()
    args += [
        "--bind",
        str(ws),
        "/workspace",
        "--tmpfs",
        "/tmp",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--unshare-all",
        "--unshare-user",
        "--uid",
        "0",
        "--gid",
        "0",
        "--info-fd",
        str(w),
        "/bin/sh",
        "-c",
        "while sleep 86400; do :; done",
    ]
    proc = subprocess.Popen(args, pass_fds=(w,), stdin=subprocess.DEVNULL)
    fh.close()
    deadline = time.monotonic() + 10
    while True:
        try:
            data = json.loads(info.read_text())
            break
        except ValueError:
            assert time.monotonic() < deadline and proc.poll() is None, "bwrap did not start"
            time.sleep(0.02)
    pid = int(data["child-pid"])
    # bwrap reports the pid before the child has built its mounts: wait until the child's
    # /workspace is ours (it switches to the new root only after every mount).
    want = os.stat(ws)
    while True:
        try:
            got = os.stat(f"/proc/{pid}/root/workspace")
            if (got.st_dev, got.st_ino) == (want.st_dev, want.st_ino):
                return proc, pid
        except OSError:
            pass
        assert time.monotonic() < deadline and proc.poll() is None, "bwrap did not set up"
        time.sleep(0.005)


@contextlib.contextmanager
def boxed_sandbox(multi: Agent, tmp_path: Path, sandbox_id: str = "boxed") -> Iterator[Agent]:
    """A bubblewrap holder registered with the multi-sandbox agent ``multi``, as the local
    backend registers one; yields the agent as that sandbox's client."""
    ws = tmp_path / "ws"
    ws.mkdir()
    proc, holder = start_holder(ws)
    body = {
        "sandbox_id": sandbox_id,
        "token": "bt",
        "workdir": "/workspace",
        "holder_pid": holder,
        "owner": [0, 0],  # the harness's holder maps the host's root as its root
        "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/workspace"},
        "mounts": [
            {"path": "/", "host_path": "/", "writable": False},
            {"path": "/workspace", "host_path": str(ws), "writable": True},
        ],
    }
    assert multi.admin("POST", "/_admin/sandboxes", json=body).status_code == 201
    try:
        yield Agent(
            multi.proc, multi.base_url, "bt", ws, sandbox_id, multi.client, multi.admin_token
        )
    finally:
        with contextlib.suppress(httpx.TransportError):  # a test may have killed the agent
            multi.admin("DELETE", f"/_admin/sandboxes/{sandbox_id}")
        os.kill(holder, 9)  # the namespace's pid 1: everything inside goes with it
        proc.kill()
        proc.wait()

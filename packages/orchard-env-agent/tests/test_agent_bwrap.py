"""A real bubblewrap holder: exec through nsenter, files via mounts, ports via setns."""

from __future__ import annotations

import base64
import os
import shutil

import pytest
from agent_harness import Agent, free_port, http_server_inside

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not shutil.which("bwrap") or os.geteuid() != 0, reason="needs bwrap and root"
    ),
]


def test_bwrap_exec_files_ports(boxed: Agent) -> None:
    j = boxed.exec("pwd; echo $$; ls /; touch /workspace/made-inside; hostname")
    assert j["status"] == "succeeded", (j["stdout"], j["stderr"], j["error"])
    lines = j["stdout"].splitlines()
    assert lines[0] == "/workspace"
    assert int(lines[1]) < 100  # its own pid namespace
    assert (boxed.workdir / "made-inside").exists()
    j = boxed.exec(["cat", "/proc/net/dev"])
    assert "eth0" not in j["stdout"]  # its own (empty) network namespace
    j = boxed.exec(["no-such-binary"])
    assert j["exit_code"] == 127
    j = boxed.exec("sleep 30 & sleep 30", timeout_seconds=0.5)
    assert j["timed_out"] is True and j["exit_code"] is None
    h = boxed.headers()
    content = base64.b64encode(b"via mount").decode()
    r = boxed.client.post("/files", json={"path": "note.txt", "content": content}, headers=h)
    assert r.status_code == 200
    assert boxed.exec(["cat", "note.txt"])["stdout"] == "via mount"
    # a server inside the sandbox's network namespace, reached through the agent
    (boxed.workdir / "hi.txt").write_text("hello from the box")
    port = free_port()  # a fixed one may be in use on the host, and the check below fails
    with http_server_inside(boxed, port, "/hi.txt") as r:
        assert r.status_code == 200 and r.text == "hello from the box"
    # and the host side cannot see it
    import socket

    with socket.socket() as s, pytest.raises(OSError):
        s.connect(("127.0.0.1", port))

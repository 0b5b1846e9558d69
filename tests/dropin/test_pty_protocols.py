"""WS /sandboxes/{id}/exec/pty speaks two protocols; the first client frame picks one.

Ours: binary frames both ways (see tests/test_ports_and_pty.py for more). The public Orchard
Env SDK's: JSON text frames, ``init`` first (orchard_env_agent.pty_json documents both).
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from orchard_env_client import SandboxClient
from orchard_testing import RunningServer

pytestmark = pytest.mark.integration


def _url(server: RunningServer, sandbox_id: str, query: str = "") -> str:
    url = server.url.replace("http://", "ws://") + f"/sandboxes/{sandbox_id}/exec/pty"
    return url + (f"?{query}" if query else "")


def _init(cmd: list[str], **fields: Any) -> str:
    return json.dumps(
        {
            "type": "init",
            "cmd": cmd,
            "env": {},
            "cwd": None,
            "rows": 24,
            "cols": 80,
            "login_shell": False,
            **fields,
        }
    )


def _session(ws: ClientConnection, *, timeout: float = 15) -> list[dict[str, Any]]:
    """The JSON frames until the server closes (binary ones are skipped)."""
    frames = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            data = ws.recv(timeout=deadline - time.monotonic())
            if isinstance(data, str):
                frames.append(json.loads(data))
    except ConnectionClosed:
        return frames
    raise AssertionError(f"the session did not end within {timeout} s: {frames}")


def _output(frames: list[dict[str, Any]]) -> str:
    chunks = [base64.b64decode(f["data"]) for f in frames if f["type"] == "stdout"]
    return b"".join(chunks).decode(errors="replace")


def _exit(frames: list[dict[str, Any]]) -> int:
    assert frames[-1]["type"] == "exit", frames
    assert frames[-1]["code"] == frames[-1]["exit_code"]
    return int(frames[-1]["code"])


def test_json_init_runs_the_argv_on_a_terminal_and_reports_its_exit(server, sandbox):
    with connect(_url(server, sandbox.sandbox_id)) as ws:
        ws.send(
            _init(
                ["bash", "-c", "tty -s && echo HAS_TTY; stty size; exit 7"],
                rows=30,
                cols=100,
                env={"X": "1"},
            )
        )
        frames = _session(ws)
        assert ws.close_code == 1000
    assert frames[0]["type"] == "ready" and isinstance(frames[0]["pid"], int)
    assert {f["type"] for f in frames} <= {"ready", "stdout", "exit"}
    assert _output(frames) == "HAS_TTY\r\n30 100\r\n"
    assert _exit(frames) == 7


def test_json_stdin_resize_and_signals(server, sandbox):
    with connect(_url(server, sandbox.sandbox_id)) as ws:
        ws.send(_init(["cat"]))
        assert json.loads(ws.recv(timeout=10))["type"] == "ready"
        ws.send(json.dumps({"type": "stdin", "data": base64.b64encode(b"ping\n").decode()}))
        seen = ""
        while seen.count("ping") < 2:  # the terminal's echo, then cat's own line
            frame = json.loads(ws.recv(timeout=10))
            seen += _output([frame])
        ws.send(json.dumps({"type": "signal", "sig": "INT"}))
        assert _exit(_session(ws)) == -2
    with connect(_url(server, sandbox.sandbox_id)) as ws:
        ws.send(_init(["bash", "-c", "stty size; sleep 0.5; stty size"]))
        assert json.loads(ws.recv(timeout=10))["type"] == "ready"
        assert _output([json.loads(ws.recv(timeout=10))]) == "24 80\r\n"
        ws.send(json.dumps({"type": "resize", "rows": 50, "cols": 200}))
        frames = _session(ws)
    assert _output(frames) == "50 200\r\n" and _exit(frames) == 0


def test_json_close_terminates_the_command_and_still_reports_its_exit(server, sandbox):
    with connect(_url(server, sandbox.sandbox_id)) as ws:
        ws.send(_init(["sleep", "60"]))
        assert json.loads(ws.recv(timeout=10))["type"] == "ready"
        ws.send(json.dumps({"type": "close"}))
        assert _exit(_session(ws)) == -15


def test_json_login_shell_cwd_and_env(server, sandbox):
    with connect(_url(server, sandbox.sandbox_id)) as ws:
        ws.send(
            _init(
                ["sh", "-c", 'pwd; echo "$GREETING"'],
                cwd="/tmp",
                login_shell=True,
                env={"GREETING": "hi there"},
            )
        )
        frames = _session(ws)
    assert _output(frames).splitlines()[-2:] == ["/tmp", "hi there"] and _exit(frames) == 0
    with connect(_url(server, sandbox.sandbox_id)) as ws:  # a cwd that is not there: /
        ws.send(_init(["pwd"], cwd="/no/such/dir"))
        assert _output(_session(ws)) == "/\r\n"


def test_json_errors(server, sandbox):
    with connect(_url(server, sandbox.sandbox_id)) as ws:
        ws.send(json.dumps({"type": "init", "cmd": "not a list"}))
        frames = _session(ws)
        assert ws.close_code == 4400
    assert frames == [
        {"type": "error", "message": "bad init frame: cmd must be a non-empty list of strings"}
    ]
    with connect(_url(server, sandbox.sandbox_id)) as ws:
        ws.send(_init(["no-such-command-here"]))
        frames = _session(ws)
    assert frames[0]["type"] == "ready"
    assert "no-such-command-here" in _output(frames) and _exit(frames) == 127


def test_a_late_init_still_selects_the_json_protocol(server, sandbox):
    with connect(_url(server, sandbox.sandbox_id)) as ws:
        time.sleep(1.0)  # past the agent's wait: it has started our protocol's shell
        ws.send(_init(["echo", "late"]))
        frames = _session(ws)
    assert frames[0]["type"] == "ready" and _output(frames) == "late\r\n" and _exit(frames) == 0


def test_our_protocol_needs_no_first_frame(server, sandbox):
    with connect(_url(server, sandbox.sandbox_id)) as ws:
        prompt = ws.recv(timeout=10)  # the login shell's prompt, unasked
        assert isinstance(prompt, bytes)
        ws.send(b"echo pty-$((6*7)); exit 3\n")
        seen = b""
        with pytest.raises(ConnectionClosed):
            while True:
                seen += ws.recv(timeout=10)  # type: ignore[operator]
    assert b"pty-42" in seen and ws.close_reason == "exit 3"
    with connect(_url(server, sandbox.sandbox_id, "command=echo%20at-once")) as ws:
        assert b"at-once" in ws.recv(timeout=5)  # type: ignore[operator]


def test_the_api_key_may_come_in_the_query(backend, tmp_path):
    server = RunningServer(backend=backend, state_dir=tmp_path / "state", api_keys="pty-key")
    server.start()
    try:
        with SandboxClient(base_url=server.url, api_key="pty-key") as client:
            sbx = client.create_sandbox(server.image)
            with pytest.raises(InvalidStatus), connect(_url(server, sbx.sandbox_id)):
                pass
            with connect(_url(server, sbx.sandbox_id, "api_key=pty-key")) as ws:
                ws.send(_init(["true"]))
                assert _exit(_session(ws)) == 0
            sbx.delete()
    finally:
        server.stop()

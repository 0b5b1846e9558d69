"""Pure-logic tests: output capping, body validation, path resolution."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchard_env_agent.context import Mount, SandboxContext
from orchard_env_agent.errors import ApiError
from orchard_env_agent.output import CappedBuffer
from orchard_env_agent.paths import resolve
from orchard_env_agent.validate import EXEC_BODY, check_body

pytestmark = pytest.mark.fast


def test_buffer_small() -> None:
    b = CappedBuffer(100)
    b.write(b"hello ")
    b.write("wörld".encode())
    assert b.text() == "hello wörld" and not b.truncated


def test_buffer_head_tail() -> None:
    b = CappedBuffer(100)
    for i in range(1000):
        b.write(f"{i:04d}\n".encode())
    t = b.text()
    assert b.truncated
    assert t.startswith("0000\n0001\n")
    assert t.endswith("0998\n0999\n")
    assert "truncated" in t
    assert len(t) < 200


def test_buffer_multibyte_split() -> None:
    b = CappedBuffer(11)
    b.write("é".encode() * 100)
    t = b.text()
    assert "\ufffd" not in t
    assert t.startswith("éé") and t.endswith("éé")


def test_buffer_binary() -> None:
    b = CappedBuffer(64)
    b.write(bytes(range(256)) * 4)
    assert b.truncated and isinstance(b.text(), str)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"command": 1}',
        b'{"command": "x", "zzz": 1}',
        b'{"command": []}',
        b'{"command": "x", "timeout_seconds": "5"}',
        b'{"command": "x", "env": {"a": 1}}',
        b'{"command": "x", "wait": 1}',
        b"{}",
    ],
)
def test_exec_body_rejected(body: bytes) -> None:
    with pytest.raises(ApiError) as ei:
        check_body(body, EXEC_BODY)
    assert ei.value.status == 422 and ei.value.code == "invalid_body"


def test_exec_body_nulls_are_defaults() -> None:
    out = check_body(b'{"command": ["a"], "cwd": null, "wait": true}', EXEC_BODY)
    assert out == {"command": ["a"], "wait": True}


def _ctx(tmp: Path) -> SandboxContext:
    ws = tmp / "ws"
    ro = tmp / "ro"
    (ws / "sub").mkdir(parents=True)
    ro.mkdir()
    (ws / "sub" / "f.txt").write_text("x")
    (tmp / "outside.txt").write_text("secret")
    os.symlink("/etc", ws / "abs_out")  # absolute: resolved in the sandbox namespace
    os.symlink("../outside.txt", ws / "rel_out")
    os.symlink("sub/f.txt", ws / "rel_in")
    os.symlink("/workspace/sub", ws / "abs_in")
    os.symlink("loop", ws / "loop")
    return SandboxContext(
        "s",
        "t",
        {},
        "/workspace",
        None,
        [Mount("/workspace", str(ws), True), Mount("/ro", str(ro), False)],
    )


def test_resolve_inside(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    r = resolve(ctx, "sub/f.txt")
    assert r.host_path == str(tmp_path / "ws" / "sub" / "f.txt") and r.exists
    assert resolve(ctx, "/workspace/rel_in").host_path == r.host_path
    assert resolve(ctx, "abs_in/f.txt").host_path == r.host_path
    assert resolve(ctx, "/workspace/sub/../sub/./f.txt").host_path == r.host_path
    assert resolve(ctx, "/ro").mount.writable is False
    m = resolve(ctx, "new/dir/file")
    assert not m.exists and m.host_path == str(tmp_path / "ws" / "new" / "dir" / "file")
    link = resolve(ctx, "rel_out", follow_last=False)
    assert link.is_link


@pytest.mark.parametrize(
    "path", ["../outside.txt", "/workspace/../x", "rel_out", "abs_out/passwd", "/.."]
)
def test_resolve_escape(tmp_path: Path, path: str) -> None:
    with pytest.raises(ApiError) as ei:
        resolve(_ctx(tmp_path), path)
    assert ei.value.status == 400 and ei.value.code == "path_escape"


def test_resolve_loop_and_unmounted(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    with pytest.raises(ApiError) as ei:
        resolve(ctx, "loop")
    assert ei.value.status == 400
    with pytest.raises(ApiError) as ei:
        resolve(ctx, "/etc/passwd")
    assert ei.value.status == 404

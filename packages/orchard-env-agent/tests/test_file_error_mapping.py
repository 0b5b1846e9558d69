"""What a failed file operation answers: errno mapping, path limits, non-regular files and
an upload cut short (pure; the HTTP view of every code is tests/test_file_errors.py)."""

from __future__ import annotations

import errno
import os
import socket
import threading
from pathlib import Path

import pytest
from starlette.requests import Request

from orchard_env_agent import anchored
from orchard_env_agent.context import Mount, SandboxContext
from orchard_env_agent.errors import ApiError, from_os_error
from orchard_env_agent.files import _receive
from orchard_env_agent.paths import NAME_MAX, PATH_MAX, check_length, resolve

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("number", "status", "code"),
    [
        (errno.ENOENT, 404, "path_not_found"),
        (errno.ENOTDIR, 400, "not_a_directory"),
        (errno.EISDIR, 400, "is_a_directory"),
        (errno.EACCES, 400, "permission_denied"),
        (errno.EPERM, 400, "permission_denied"),
        (errno.EROFS, 400, "read_only"),
        (errno.ENAMETOOLONG, 400, "invalid_path"),
        (errno.ELOOP, 400, "path_escape"),
        (errno.ENOSPC, 400, "no_space"),
        (errno.EDQUOT, 400, "no_space"),
        (errno.EFBIG, 413, "too_large"),
        (errno.EBUSY, 400, "io_error"),
        (errno.EIO, 400, "io_error"),
    ],
)
def test_each_errno_has_its_code(number: int, status: int, code: str) -> None:
    error = from_os_error(OSError(number, os.strerror(number)), "/workspace/f")
    assert (error.status, error.code) == (status, code)
    assert "/workspace/f" in error.detail


def test_an_unnamed_errno_keeps_the_systems_words() -> None:
    error = from_os_error(OSError(errno.EBUSY, os.strerror(errno.EBUSY)), "/etc/hosts")
    assert error.detail == "'/etc/hosts': Device or resource busy"


def _ctx(tmp_path: Path) -> SandboxContext:
    mounts = [Mount("/workspace", str(tmp_path), True)]
    return SandboxContext(
        sandbox_id="s", token="t", env={}, workdir="/workspace", holder_pid=None, mounts=mounts
    )


@pytest.mark.parametrize(
    "path",
    [
        "/workspace/" + "n" * (NAME_MAX + 1),
        "n" * (NAME_MAX + 1),  # relative: joined to the workdir first
        "/workspace/missing/" + "n" * (NAME_MAX + 1) + "/deeper",
        "/workspace/" + "/".join(["d" * 200] * 21),  # every name fine, the whole too long
        "x/" * (PATH_MAX // 2 - 5),  # short only before the workdir is joined
        "/workspace/a\0b",
        "/workspace/\ud800",  # a lone surrogate: no bytes encode it
    ],
)
def test_paths_no_system_call_could_take_are_invalid_path(tmp_path: Path, path: str) -> None:
    with pytest.raises(ApiError) as raised:
        resolve(_ctx(tmp_path), path)
    assert (raised.value.status, raised.value.code) == (400, "invalid_path")


def test_the_limits_themselves_pass(tmp_path: Path) -> None:
    check_length("/" + "n" * NAME_MAX)
    longest = "/" + "/".join(["d" * 200] * 20)
    longest += "/" + "e" * (PATH_MAX - 2 - len(longest))
    assert len(longest) == PATH_MAX - 1
    check_length(longest)
    (tmp_path / ("n" * NAME_MAX)).write_text("x")
    assert resolve(_ctx(tmp_path), "n" * NAME_MAX).exists


def test_a_fifo_is_refused_without_being_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    opened = threading.Event()

    def writer() -> None:  # blocks in open() until someone opens the FIFO for reading
        with open(tmp_path / "fifo", "wb"):
            opened.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    anchor = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(anchored.NotAFile, match="FIFO"):
            anchored.open_file(anchor, "fifo")
        assert not opened.wait(0.2)  # the waiting writer was not woken
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(tmp_path / "sock"))
            with pytest.raises(anchored.NotAFile, match="socket"):
                anchored.open_file(anchor, "sock")
        with pytest.raises(IsADirectoryError):
            anchored.open_file(anchor, ".")
        (tmp_path / "plain").write_bytes(b"data")
        with anchored.open_file(anchor, "plain") as fh:
            assert fh.read() == b"data"
    finally:
        os.close(anchor)
        os.close(os.open(tmp_path / "fifo", os.O_RDONLY | os.O_NONBLOCK))  # frees the writer
        thread.join(5)


def test_the_device_check_names_the_kind() -> None:
    anchor = os.open("/dev", os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(anchored.NotAFile, match="device"):
            anchored.open_file(anchor, "null")
    finally:
        os.close(anchor)


async def test_an_upload_cut_short_is_upload_aborted(tmp_path: Path) -> None:
    # Through the orchestrator nobody hears this answer (the client is gone); the agent
    # still answers it, and the caller drops the partial file.
    messages = [
        {"type": "http.request", "body": b"x" * 10, "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, object]:
        return messages.pop(0)

    scope = {"type": "http", "method": "PUT", "headers": [(b"content-length", b"1000")]}
    with open(tmp_path / "out", "wb") as out, pytest.raises(ApiError) as raised:
        await _receive(Request(scope, receive), out, 1 << 20)
    assert (raised.value.status, raised.value.code) == (400, "upload_aborted")

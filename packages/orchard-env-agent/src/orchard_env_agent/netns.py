"""Creating TCP connections inside another process's network namespace."""

from __future__ import annotations

import ctypes
import os
import socket

CLONE_NEWNET = 0x40000000
# The libc already loaded: find_library would spawn the image's ldconfig at import time.
_libc = ctypes.CDLL(None, use_errno=True)
_own_netns: int | None = None


def remember_own_netns() -> None:
    """Keep an fd of the agent's own network namespace (call at startup)."""
    global _own_netns
    if _own_netns is None:
        _own_netns = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def socket_in(holder_pid: int | None) -> socket.socket:
    """Blocking: a TCP socket in the network namespace of ``holder_pid`` (None: the agent's
    own). setns affects only the calling thread, which returns to its own namespace; the
    socket stays in the one it was created in, for connecting or listening."""
    if holder_pid is None:
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    remember_own_netns()
    assert _own_netns is not None
    target = os.open(f"/proc/{holder_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(target)
        try:
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            _setns(_own_netns)
    finally:
        os.close(target)


def connect(port: int, holder_pid: int | None, timeout: float = 10.0) -> socket.socket:
    """Blocking: run in a worker thread. setns only affects the calling thread."""
    if holder_pid is None:
        return socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock = socket_in(holder_pid)
    try:
        sock.settimeout(timeout)
        sock.connect(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock

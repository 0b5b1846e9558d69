"""File work on a sandbox's behalf, done as the sandbox's owner.

The local agent runs as root on the host. A sandbox's root is an unprivileged host uid
(its user namespace's range), and the file API acts as that uid for every file it touches:
the files it writes belong to the sandbox, and a path that a sandbox swaps for a link
between the check and the use can reach no more of the host than that unprivileged user
could. Linux keeps the filesystem uid and gid (``setfsuid``/``setfsgid``) and, through the
raw system call, the supplementary groups per thread, so only the worker thread doing the
work changes, and it changes back before it serves anything else.

Paths go through an fd of their mount's host directory, opened by root
(``/proc/self/fd/N/...``): the owner need not be able to walk the state dir's private
parents, and the mount's root stays the one that was resolved.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio.to_thread

from .context import SandboxContext
from .paths import Resolved

T = TypeVar("T")
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}
_libc = ctypes.CDLL(None, use_errno=True)


def _set_thread_groups(groups: list[int]) -> None:
    """setgroups for the calling thread only (libc's wrapper changes every thread)."""
    number = _SYS_SETGROUPS.get(platform.machine())
    if number is None:
        raise OSError(f"unsupported machine for per-thread groups: {platform.machine()}")
    array = (ctypes.c_uint * max(1, len(groups)))(*groups)
    if _libc.syscall(number, len(groups), array if groups else None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setgroups: {os.strerror(errno)}")


def _set_fs_ids(uid: int, gid: int) -> None:
    _libc.setfsgid(gid)
    _libc.setfsuid(uid)
    # Both calls return the previous id, whatever happened: ask again with an invalid id.
    if _libc.setfsuid(0xFFFFFFFF) != uid or _libc.setfsgid(0xFFFFFFFF) != gid:
        raise OSError(f"cannot act as uid {uid}, gid {gid}")


@contextlib.contextmanager
def acting_as(owner: tuple[int, int] | None) -> Iterator[None]:
    """This thread's file access as ``owner`` (uid, gid), without groups; a no-op for None
    or when the agent is not root (it then is already the sandbox's owner)."""
    if owner is None or os.geteuid() != 0:
        yield
        return
    groups = os.getgroups()
    _set_thread_groups([])
    try:
        _set_fs_ids(*owner)
        yield
    finally:
        _set_fs_ids(os.geteuid(), os.getegid())
        _set_thread_groups(groups)


class SandboxIO:
    """One request's file work: ``path()`` maps host paths under the resolved mount, and
    ``run()`` calls a blocking function in a worker thread acting as the sandbox's owner."""

    def __init__(self, ctx: SandboxContext, resolved: Resolved) -> None:
        self._owner = ctx.owner if os.geteuid() == 0 else None
        self._mount = resolved.mount.host_path.rstrip("/") or "/"
        self._fd: int | None = None

    async def __aenter__(self) -> SandboxIO:
        if self._owner is not None:
            self._fd = await anyio.to_thread.run_sync(
                lambda: os.open(self._mount, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            )
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def path(self, host_path: str) -> str:
        if self._fd is None:
            return host_path
        rest = host_path[len(self._mount) :] if self._mount != "/" else host_path
        if host_path != self._mount and not host_path.startswith(self._mount.rstrip("/") + "/"):
            raise ValueError(f"{host_path!r} is not under {self._mount!r}")
        return f"/proc/self/fd/{self._fd}/{rest.lstrip('/')}".rstrip("/")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        owner = self._owner

        def call() -> T:
            with acting_as(owner):
                return fn(*args)

        return await anyio.to_thread.run_sync(call)

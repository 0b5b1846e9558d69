"""File work on a sandbox's behalf, done as the sandbox's owner.

The local agent runs as root on the host. A sandbox's root is an unprivileged host uid
(its user namespace's range), and the file API acts as that uid for every file it touches:
the files it writes belong to the sandbox, and a path that a sandbox swaps for a link
between the check and the use can reach no more of the host than that unprivileged user
could. Linux keeps the filesystem uid and gid (``setfsuid``/``setfsgid``) and, through the
raw system call, the supplementary groups per thread, so only the worker thread doing the
work changes, and it changes back before it serves anything else.

Paths are opened relative to an anchor fd that root opened (``anchored``): the owner need
not be able to walk the state dir's private parents, and no link leads out of the anchor.
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
from .errors import ApiError
from .paths import Resolved

T = TypeVar("T")
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}
_libc = ctypes.CDLL(None, use_errno=True)
# uid_t is unsigned: sandbox ranges start at 10^9 and reach past 2^31.
for _name in ("setfsuid", "setfsgid"):
    getattr(_libc, _name).restype = ctypes.c_uint
    getattr(_libc, _name).argtypes = [ctypes.c_uint]


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
    """One request's file work: an anchor fd for ``anchored`` operations and the resolved
    path relative to it; ``run()`` calls a blocking function in a worker thread acting as
    the sandbox's owner, with the anchor as its first argument.

    The anchor is an isolated sandbox's own root (its holder's ``/proc/PID/root``: links
    resolve as the sandbox sees them), else the resolved mount's host directory."""

    def __init__(self, ctx: SandboxContext, resolved: Resolved) -> None:
        self._owner = ctx.owner if os.geteuid() == 0 else None
        if ctx.holder_pid is not None and os.geteuid() == 0 and ctx.owner is None:
            # Root doing an isolated sandbox's file work as root: never.
            raise ApiError(500, "no_owner", "this sandbox was registered without its owner")
        if ctx.holder_pid is not None:
            self._anchor_path = f"/proc/{ctx.holder_pid}/root"
            self.path = resolved.sandbox_path
        else:
            mount = resolved.mount.host_path.rstrip("/") or "/"
            self._anchor_path = mount
            self.path = resolved.host_path[len(mount) :] if mount != "/" else resolved.host_path
        self.path = self.path.strip("/") or "."
        self._anchor: int | None = None

    async def __aenter__(self) -> SandboxIO:
        self._anchor = await anyio.to_thread.run_sync(
            lambda: os.open(self._anchor_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        )
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._anchor is not None:
            os.close(self._anchor)
            self._anchor = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        owner, anchor = self._owner, self._anchor
        assert anchor is not None, "use SandboxIO as an async context manager"

        def call() -> T:
            with acting_as(owner):
                return fn(anchor, *args)

        return await anyio.to_thread.run_sync(call)

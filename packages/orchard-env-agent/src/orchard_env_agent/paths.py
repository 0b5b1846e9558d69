"""Resolving sandbox paths to host paths through the mounts, refusing escapes.

The walk goes component by component with fd-relative ``os.open(O_PATH|O_NOFOLLOW)`` from
the mount's host directory, so every symlink is seen and its target is re-resolved as a
sandbox path (absolute targets against the sandbox root, relative ones against the link's
directory). Leaving all mounts through ``..`` or a link answers ``path_escape``; a path no
system call could take (a NUL, a name over 255 bytes, 4096 bytes or more) ``invalid_path``.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections import deque
from dataclasses import dataclass

from .context import Mount, SandboxContext
from .errors import ApiError, from_os_error

MAX_LINKS = 40
NAME_MAX = 255  # bytes in one path component
PATH_MAX = 4096  # bytes in a path, its terminating NUL included


@dataclass
class Resolved:
    sandbox_path: str
    host_path: str
    mount: Mount
    exists: bool
    is_dir: bool
    is_link: bool  # only when follow_last=False and the last component is a link


def _escape(path: str, why: str) -> ApiError:
    return ApiError(400, "path_escape", f"path {path!r} {why}")


def check_length(path: str) -> None:
    """Refuse, as ``invalid_path``, a path no system call could take: a NUL byte, a name
    over ``NAME_MAX`` bytes or a path of ``PATH_MAX`` bytes or more (Linux's limits)."""
    if "\0" in path:
        raise ApiError(400, "invalid_path", "path holds a NUL byte")
    try:
        raw = os.fsencode(path)
    except UnicodeEncodeError:
        raise ApiError(400, "invalid_path", f"path {path!r} cannot be encoded") from None
    if len(raw) >= PATH_MAX:
        raise ApiError(
            400,
            "invalid_path",
            f"path is {len(raw)} bytes long; the limit is {PATH_MAX - 1}",
        )
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        raise ApiError(
            400,
            "invalid_path",
            f"a name in the path is {len(longest)} bytes long; the limit is {NAME_MAX}",
        )


def _join(parts: list[str]) -> str:
    return "/" + "/".join(parts)


class _Walk:
    """One resolution in progress: the sandbox path so far (``cur``), an ``O_PATH`` fd of
    its host directory (None outside every mount) and what the walk has seen."""

    def __init__(self, ctx: SandboxContext, path: str, follow_last: bool) -> None:
        self.ctx = ctx
        self.path = path
        self.follow_last = follow_last
        self.mount_paths = {m.path: m for m in ctx.mounts}
        self.queue: deque[str] = deque(path.split("/"))
        self.cur: list[str] = []
        self.fd: int | None = None
        self.hops = 0
        self.indirect = False  # ".." or a link was followed: leaving the mounts is an escape
        self.missing = False
        self.last_is_link = False
        self.last_st: os.stat_result | None = None

    def reopen(self) -> int | None:
        """fd for ``cur``, re-walked from the deepest mount (after '..' or a link)."""
        best: Mount | None = None
        rest: list[str] = []
        for i in range(len(self.cur), -1, -1):
            best = self.mount_paths.get(_join(self.cur[:i])) if i else self.mount_paths.get("/")
            if best is not None:
                rest = self.cur[i:]
                break
        if best is None:
            return None
        nfd = os.open(best.host_path, os.O_PATH | os.O_DIRECTORY)
        for comp in rest:
            try:
                new = os.open(comp, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=nfd)
            finally:
                os.close(nfd)
            nfd = new
        return nfd

    def set_fd(self, new: int | None) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.fd = new

    def run(self) -> None:
        try:
            self.set_fd(self.reopen())
            while self.queue:
                self.step(self.queue.popleft())
        except OSError as exc:
            raise from_os_error(exc, self.path) from None
        finally:
            self.set_fd(None)

    def step(self, comp: str) -> None:
        if comp in ("", "."):
            return
        if comp == "..":
            self._up()
        elif self.missing:
            self.cur.append(comp)
        elif _join([*self.cur, comp]) in self.mount_paths:
            self._enter_mount(comp)
        elif self.fd is None:
            self._outside_mounts(comp)
        else:
            self._entry(comp, self.fd)

    def _up(self) -> None:
        if not self.cur:
            raise _escape(self.path, "goes above the sandbox root")
        self.cur.pop()
        self.indirect = True
        self.last_st = None
        if not self.missing:
            self.set_fd(self.reopen())

    def _enter_mount(self, comp: str) -> None:
        """A mount point: start over at its host dir."""
        self.cur.append(comp)
        new = os.open(self.mount_paths[_join(self.cur)].host_path, os.O_PATH | os.O_DIRECTORY)
        self.set_fd(new)
        self.last_st, self.last_is_link = os.stat(new), False

    def _outside_mounts(self, comp: str) -> None:
        """Outside every mount only the parents of mount points exist."""
        self.cur.append(comp)
        prefix = _join(self.cur) + "/"
        if not any(p.startswith(prefix) for p in self.mount_paths):
            if self.indirect:
                raise _escape(self.path, "leaves the sandbox's mounts")
            raise ApiError(404, "path_not_found", f"no such path: {self.path!r}")
        self.last_st = None

    def _entry(self, comp: str, fd: int) -> None:
        try:
            st = os.stat(comp, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            self.missing = True
            self.cur.append(comp)
            return
        except NotADirectoryError:
            raise ApiError(
                400, "not_a_directory", f"{_join(self.cur)!r} is not a directory"
            ) from None
        if stat.S_ISLNK(st.st_mode) and (self.queue or self.follow_last):
            self._follow(comp, fd)
            return
        self.cur.append(comp)
        self.last_st, self.last_is_link = st, stat.S_ISLNK(st.st_mode)
        if stat.S_ISDIR(st.st_mode) and self.queue:
            self.set_fd(os.open(comp, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=fd))
        elif any(c not in ("", ".") for c in self.queue):
            raise ApiError(400, "not_a_directory", f"{_join(self.cur)!r} is not a directory")

    def _follow(self, comp: str, fd: int) -> None:
        """A link: its target is walked as a sandbox path (absolute from the root)."""
        self.hops += 1
        if self.hops > MAX_LINKS:
            raise ApiError(400, "path_escape", f"too many levels of links in {self.path!r}")
        target = os.readlink(comp, dir_fd=fd)
        self.indirect = True
        self.last_st = None
        if target.startswith("/"):
            self.cur = []
        self.queue.extendleft(reversed(target.split("/")))
        self.set_fd(self.reopen())

    def resolved(self) -> Resolved:
        sandbox_path = _join(self.cur)
        mount = self.ctx.mount_for(sandbox_path)
        if mount is None:
            if self.indirect:
                raise _escape(self.path, "leaves the sandbox's mounts")
            raise ApiError(404, "path_not_found", f"no mount holds {sandbox_path!r}")
        host = self.ctx.host_path_for(sandbox_path)
        assert host is not None
        last_st = self.last_st
        exists = not self.missing
        if exists and last_st is None:
            with contextlib.suppress(OSError):
                last_st = os.lstat(host)
            exists = last_st is not None
        return Resolved(
            sandbox_path=sandbox_path,
            host_path=host,
            mount=mount,
            exists=exists,
            is_dir=bool(exists and last_st is not None and stat.S_ISDIR(last_st.st_mode)),
            is_link=self.last_is_link,
        )


def resolve(ctx: SandboxContext, path: str, *, follow_last: bool = True) -> Resolved:
    """Where sandbox ``path`` (relative: to the workdir) is on the host, refusing escapes.

    Blocking (does file-system calls): run it in a worker thread.
    """
    if not isinstance(path, str) or not path:
        raise ApiError(400, "invalid_path", "path must be a non-empty string")
    if not path.startswith("/"):
        path = (ctx.workdir or "/").rstrip("/") + "/" + path
    check_length(path)
    walk = _Walk(ctx, path, follow_last)
    walk.run()
    return walk.resolved()


def require_writable(r: Resolved) -> None:
    if not r.mount.writable:
        raise ApiError(
            400, "read_only", f"{r.sandbox_path!r} is on a read-only mount ({r.mount.path})"
        )


def require_exists(r: Resolved) -> None:
    if not r.exists:
        raise ApiError(404, "path_not_found", f"no such path: {r.sandbox_path!r}")

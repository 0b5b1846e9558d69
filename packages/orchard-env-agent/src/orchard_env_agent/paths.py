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


def resolve(ctx: SandboxContext, path: str, *, follow_last: bool = True) -> Resolved:
    """Blocking (does file-system calls): run it in a worker thread."""
    if not isinstance(path, str) or not path:
        raise ApiError(400, "invalid_path", "path must be a non-empty string")
    if not path.startswith("/"):
        path = (ctx.workdir or "/").rstrip("/") + "/" + path
    check_length(path)
    mount_paths = {m.path: m for m in ctx.mounts}
    queue: deque[str] = deque(path.split("/"))
    cur: list[str] = []
    fd: int | None = None  # O_PATH fd of the host dir for `cur`, None outside any mount
    hops = 0
    indirect = False  # ".." or a link was followed: leaving the mounts is an escape
    missing = False
    last_is_link = False
    last_st: os.stat_result | None = None

    def reopen() -> int | None:
        """fd for `cur`, re-walked from the deepest mount (after '..' or a link)."""
        best: Mount | None = None
        for i in range(len(cur), -1, -1):
            best = mount_paths.get(_join(cur[:i])) if i else mount_paths.get("/")
            if best is not None:
                rest = cur[i:]
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

    def set_fd(new: int | None) -> None:
        nonlocal fd
        if fd is not None:
            os.close(fd)
        fd = new

    try:
        set_fd(reopen())
        while queue:
            comp = queue.popleft()
            if comp in ("", "."):
                continue
            if comp == "..":
                if not cur:
                    raise _escape(path, "goes above the sandbox root")
                cur.pop()
                indirect = True
                last_st = None
                if not missing:
                    set_fd(reopen())
                continue
            if missing:
                cur.append(comp)
                continue
            child = _join([*cur, comp])
            if child in mount_paths:  # a mount point: start over at its host dir
                cur.append(comp)
                set_fd(os.open(mount_paths[child].host_path, os.O_PATH | os.O_DIRECTORY))
                last_st, last_is_link = os.stat(fd), False  # type: ignore[arg-type]
                continue
            if fd is None:
                # outside every mount: only the parents of mount points exist here
                cur.append(comp)
                prefix = child + "/"
                if not any(p.startswith(prefix) for p in mount_paths):
                    if indirect:
                        raise _escape(path, "leaves the sandbox's mounts")
                    raise ApiError(404, "path_not_found", f"no such path: {path!r}")
                last_st = None
                continue
            try:
                st = os.stat(comp, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                missing = True
                cur.append(comp)
                continue
            except NotADirectoryError:
                raise ApiError(
                    400, "not_a_directory", f"{_join(cur)!r} is not a directory"
                ) from None
            if stat.S_ISLNK(st.st_mode) and (queue or follow_last):
                hops += 1
                if hops > MAX_LINKS:
                    raise ApiError(400, "path_escape", f"too many levels of links in {path!r}")
                target = os.readlink(comp, dir_fd=fd)
                indirect = True
                last_st = None
                if target.startswith("/"):
                    cur = []
                queue.extendleft(reversed(target.split("/")))
                set_fd(reopen())
                continue
            cur.append(comp)
            last_st, last_is_link = st, stat.S_ISLNK(st.st_mode)
            if stat.S_ISDIR(st.st_mode) and queue:
                new = os.open(comp, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=fd)
                set_fd(new)
            elif any(c not in ("", ".") for c in queue):
                raise ApiError(400, "not_a_directory", f"{_join(cur)!r} is not a directory")
    except OSError as exc:
        raise from_os_error(exc, path) from None
    finally:
        set_fd(None)

    sandbox_path = _join(cur)
    mount = ctx.mount_for(sandbox_path)
    if mount is None:
        if indirect:
            raise _escape(path, "leaves the sandbox's mounts")
        raise ApiError(404, "path_not_found", f"no mount holds {sandbox_path!r}")
    host = ctx.host_path_for(sandbox_path)
    assert host is not None
    exists = not missing
    if not missing and last_st is None:
        with contextlib.suppress(OSError):
            last_st = os.lstat(host)
        exists = last_st is not None
    return Resolved(
        sandbox_path=sandbox_path,
        host_path=host,
        mount=mount,
        exists=exists,
        is_dir=bool(exists and last_st is not None and stat.S_ISDIR(last_st.st_mode)),
        is_link=last_is_link,
    )


def require_writable(r: Resolved) -> None:
    if not r.mount.writable:
        raise ApiError(
            400, "read_only", f"{r.sandbox_path!r} is on a read-only mount ({r.mount.path})"
        )


def require_exists(r: Resolved) -> None:
    if not r.exists:
        raise ApiError(404, "path_not_found", f"no such path: {r.sandbox_path!r}")

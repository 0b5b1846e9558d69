"""File helpers of the store: flocks, atomic JSON, and removing trees a non-root unpacker
may have made unwritable (a layer's 0555 directories)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from orchard_env_agent.anchored import open_at

log = logging.getLogger("orchard_env_server.images")


@contextlib.contextmanager
def flocked(path: Path, shared: bool = False) -> Iterator[int]:
    """Hold an flock of ``path`` (made if missing), across threads and processes alike."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def try_flock(fd: int) -> bool:
    """An exclusive flock of ``fd`` if nobody else holds one (it goes with the fd)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def write_json(path: Path, doc: Any) -> None:
    """Replace ``path`` atomically with ``doc`` as JSON."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(doc, out, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class Removed:
    """What removals freed: entries (not counting directories) and bytes of files."""

    def __init__(self) -> None:
        self.files = 0
        self.bytes = 0
        self._seen: set[tuple[int, int]] = set()

    def count(self, st: os.stat_result) -> None:
        self.files += 1
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in self._seen:
            if st.st_nlink > 1:
                self._seen.add((st.st_dev, st.st_ino))
            self.bytes += st.st_size


def remove_path(path: Path, removed: Removed) -> None:
    """Remove ``path`` (a file, a link or a whole tree), never following links."""
    parent = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        remove_entry(parent, path.name, removed)
    finally:
        os.close(parent)


def remove_entry(parent: int, name: str, removed: Removed) -> None:
    """Remove entry ``name`` of directory fd ``parent``, never following links.

    A sandbox or a layer can make a tree deeper than Python's recursion limit and than the
    open-file limit, so the walk holds one directory fd at a time (and a stack of the
    names left to visit on the way down): it comes back up through ``..``, checked to be
    the directory it left. It never enters a mount point (a bind mount of the same file
    system included): the directories holding one stay, and it raises ``EBUSY``."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent)
        removed.count(st)
        return
    if _is_mount_point(parent, name):
        raise OSError(errno.EBUSY, "a mount point: unmount it first", name)
    fd = _open_writable_dir(parent, name)
    # Each frame: a directory's name, identity, the entries of it still to visit and
    # whether it must stay (it holds a mount point, which is never entered).
    stack: list[_Frame] = []
    kept = False
    try:
        stack.append(_Frame(name, _identity(fd, st), os.listdir(fd)))
        while stack:
            frame = stack[-1]
            if frame.entries:
                entry = frame.entries.pop()
                try:
                    child = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISDIR(child.st_mode):
                    os.unlink(entry, dir_fd=fd)
                    removed.count(child)
                elif child.st_dev != frame.identity[0] or _is_mount_point(fd, entry):
                    frame.keep = True
                else:
                    below = _open_writable_dir(fd, entry)
                    os.close(fd)
                    fd = below
                    stack.append(_Frame(entry, _identity(fd, child), os.listdir(fd)))
                continue
            done = stack.pop()
            if not stack:
                kept = done.keep
                break
            up = os.open(
                "..", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            os.close(fd)
            fd = up
            if _identity(fd, None) != stack[-1].identity:
                raise OSError(errno.ESTALE, "the tree was moved while it was removed", done.name)
            if done.keep:
                stack[-1].keep = True
            else:
                os.rmdir(done.name, dir_fd=fd)
    finally:
        os.close(fd)
    if kept:
        raise OSError(errno.EBUSY, "mount points inside it were left in place", name)
    os.rmdir(name, dir_fd=parent)


@attrs.define
class _Frame:
    name: str
    identity: tuple[int, int]
    entries: list[str]
    keep: bool = False


def _is_mount_point(parent: int, name: str) -> bool:
    """Whether directory ``name`` of ``parent`` is a mount point (a bind mount of the
    same file system too, which ``st_dev`` cannot tell)."""
    try:
        fd = open_at(parent, name, os.O_PATH | os.O_NOFOLLOW, same_mount=True)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            return True
        raise
    os.close(fd)
    return False


def _identity(fd: int, expected: os.stat_result | None) -> tuple[int, int]:
    """(device, inode) of the directory open at ``fd``; it must be ``expected``'s."""
    st = os.fstat(fd)
    if expected is not None and (st.st_dev, st.st_ino) != (expected.st_dev, expected.st_ino):
        raise OSError(errno.ESTALE, "a directory was replaced while it was removed")
    return st.st_dev, st.st_ino


def remove_tree(path: Path) -> None:
    """Remove ``path`` and what it holds if it exists, as ``remove_path`` does; an error
    is logged, not raised (the caller has nothing better to do with it)."""
    try:
        remove_path(path, Removed())
    except OSError as exc:
        log.warning("could not remove %s entirely: %s", path, exc)


def _open_writable_dir(parent: int, name: str) -> int:
    """Directory ``name`` opened for listing, made 0700 first when we cannot (non-root)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=parent)
    except PermissionError:
        path_fd = os.open(
            name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent
        )
        try:
            os.chmod(f"/proc/self/fd/{path_fd}", 0o700)  # fchmod refuses O_PATH fds
        finally:
            os.close(path_fd)
        return os.open(name, flags, dir_fd=parent)
    if os.geteuid() != 0:
        try:
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
            if mode & 0o700 != 0o700:
                os.fchmod(fd, mode | 0o700)
        except OSError as exc:
            if exc.errno != errno.EPERM:
                raise
    return fd

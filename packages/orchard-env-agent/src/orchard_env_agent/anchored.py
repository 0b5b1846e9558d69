"""File operations anchored at a directory fd, which no link can lead out of.

Every path is opened with ``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`` relative to
an anchor: an isolated local sandbox's own root (``/proc/HOLDER/root``), else the mount's
host directory. Links, ``..`` and absolute targets then resolve as they would inside the
sandbox, never above the anchor, and ``/proc/*/fd``-style links are refused. A sandbox
that swaps a directory for a link while the file API works on it can redirect the work
only to another place of its own view. Files are created ``O_EXCL``/``O_NOFOLLOW`` next to
their target and renamed into place through the parent's fd; archives are written and
read member by member through fds (``tarfile`` itself would walk path strings).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import stat
import tarfile
from collections.abc import Callable, Iterator
from typing import IO, Any

_SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64
_RESOLVE_NO_XDEV = 0x01
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_libc = ctypes.CDLL(None, use_errno=True)
TEMP_PREFIX = ".orchard-upload-"


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def open_at(
    anchor: int, path: str, flags: int, mode: int = 0o644, *, same_mount: bool = False
) -> int:
    """An fd for ``path`` resolved inside ``anchor`` (see the module doc); with
    ``same_mount``, never through a mount point (``EXDEV``)."""
    resolve = _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS | (_RESOLVE_NO_XDEV if same_mount else 0)
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, resolve)
    fd = _libc.syscall(
        _SYS_OPENAT2, anchor, os.fsencode(path or "."), ctypes.byref(how), ctypes.sizeof(how)
    )
    if fd < 0:
        err = ctypes.get_errno()
        if err == errno.ELOOP:
            raise OSError(err, "a link on the way leads out of the sandbox's view", path)
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def _split(path: str) -> tuple[str, str]:
    parent, _, name = path.strip("/").rpartition("/")
    if not name or name in (".", ".."):
        raise IsADirectoryError(errno.EISDIR, "not a file name", path)
    return parent, name


def ensure_dir(anchor: int, path: str) -> int:
    """An O_PATH fd of directory ``path``, made (with its parents) where missing."""
    try:
        return open_at(anchor, path, os.O_PATH | os.O_DIRECTORY)
    except FileNotFoundError:
        pass
    parts = [p for p in path.strip("/").split("/") if p not in ("", ".")]
    fd = open_at(anchor, "", os.O_PATH | os.O_DIRECTORY)
    try:
        for i, name in enumerate(parts):
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=fd)
            new = open_at(anchor, "/".join(parts[: i + 1]), os.O_PATH | os.O_DIRECTORY)
            os.close(fd)
            fd = new
    except BaseException:
        os.close(fd)
        raise
    return fd


class PendingFile:
    """A temp file made beside ``path`` (``O_EXCL``, never through a link): ``commit()``
    renames it over ``path`` through the parent's fd, ``discard()`` removes it."""

    def __init__(self, anchor: int, path: str) -> None:
        parent, self._name = _split(path)
        self._parent = ensure_dir(anchor, parent)
        self._tmp = f"{TEMP_PREFIX}{secrets.token_hex(6)}"
        try:
            fd = os.open(
                self._tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=self._parent,
            )
        except BaseException:
            os.close(self._parent)
            raise
        self.file: IO[bytes] = os.fdopen(fd, "wb")

    def commit(self) -> None:
        try:
            self.file.close()
            os.replace(self._tmp, self._name, src_dir_fd=self._parent, dst_dir_fd=self._parent)
        except BaseException:
            self.discard()
            raise
        os.close(self._parent)

    def discard(self) -> None:
        self.file.close()
        with contextlib.suppress(OSError):
            os.unlink(self._tmp, dir_fd=self._parent)
        with contextlib.suppress(OSError):
            os.close(self._parent)


@contextlib.contextmanager
def new_file(anchor: int, path: str) -> Iterator[IO[bytes]]:
    """A ``PendingFile`` committed when the block ends without error, else discarded."""
    pending = PendingFile(anchor, path)
    try:
        yield pending.file
    except BaseException:
        pending.discard()
        raise
    pending.commit()


def write_file(anchor: int, path: str, data: bytes) -> int:
    with new_file(anchor, path) as fh:
        fh.write(data)
    return len(data)


class NotAFile(OSError):
    """A FIFO, socket or device where a regular file was asked for: opening it could block
    (a FIFO), wake a writer waiting on it, or never end (``/dev/zero``)."""


def _require_regular(mode: int, path: str) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", path)
    raise NotAFile(errno.EINVAL, f"is a {_kind(mode)}, not a regular file", path)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "special file"


def open_file(anchor: int, path: str) -> IO[bytes]:
    """A regular file opened for reading; its type is checked before it is opened (an
    O_PATH fd opens nothing) and again after (the sandbox may swap it meanwhile)."""
    probe = open_at(anchor, path, os.O_PATH)
    try:
        _require_regular(os.fstat(probe).st_mode, path)
    finally:
        os.close(probe)
    fd = open_at(anchor, path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        _require_regular(os.fstat(fd).st_mode, path)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_file(anchor: int, path: str) -> bytes:
    with open_file(anchor, path) as fh:
        return fh.read()


def list_dir(anchor: int, path: str) -> list[dict[str, Any]]:
    fd = open_at(anchor, path, os.O_RDONLY | os.O_DIRECTORY)
    out: list[dict[str, Any]] = []
    try:
        for name in os.listdir(fd):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            kind = (
                "symlink"
                if stat.S_ISLNK(st.st_mode)
                else "directory"
                if stat.S_ISDIR(st.st_mode)
                else "file"
            )
            out.append({"name": name, "type": kind, "size": st.st_size, "modified": st.st_mtime})
    finally:
        os.close(fd)
    out.sort(key=lambda e: e["name"])
    return out


def extract(anchor: int, dest: str, tf: tarfile.TarFile, members: list[tarfile.TarInfo]) -> None:
    """Checked members (``tarsafe``) written under ``dest`` one by one through fds: files
    and directories with their mode (no setuid bits), links as links; hard links become
    copies of their (earlier) target."""
    root = dest.rstrip("/")
    for member in members:
        target = f"{root}/{member.name}".rstrip("/")
        if member.isdir():
            os.close(ensure_dir(anchor, target))
            continue
        parent, name = _split(target)
        parent_fd = ensure_dir(anchor, parent)
        try:
            if member.issym():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=parent_fd)
                os.symlink(member.linkname, name, dir_fd=parent_fd)
                continue
        finally:
            os.close(parent_fd)
        source = tf.extractfile(member)  # a hard link's: its target's contents
        if source is None:
            continue  # refused earlier: no other kind passes tarsafe
        with source as src, new_file(anchor, target) as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
            os.fchmod(out.fileno(), member.mode & 0o755 if member.isreg() else 0o644)
            out.flush()
            os.utime(out.fileno(), (member.mtime, member.mtime))


def tar_tree(anchor: int, path: str, sink: Callable[[bytes], None]) -> None:
    """Write directory ``path`` as a tar stream into ``sink``, walking by fds (links are
    archived as links, never followed)."""
    writer = _Chunks(sink)
    top = open_at(anchor, path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tf:  # type: ignore[call-overload]
            for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=top):
                prefix = "" if dirpath == "." else dirpath[2:] + "/"
                for name in sorted(dirnames) + sorted(filenames):
                    _add(tf, dir_fd, name, prefix + name)
    finally:
        os.close(top)
    writer.flush()


def _add(tf: tarfile.TarFile, dir_fd: int, name: str, arcname: str) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    info = tarfile.TarInfo(arcname)
    info.mode, info.mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime)
    info.uid, info.gid = st.st_uid, st.st_gid
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        tf.addfile(info)
    elif stat.S_ISLNK(st.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=dir_fd)
        tf.addfile(info)
    elif stat.S_ISREG(st.st_mode):
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            return  # swapped or unreadable meanwhile: left out
        with os.fdopen(fd, "rb") as fh:
            info.size = os.fstat(fd).st_size
            tf.addfile(info, _Exactly(fh, info.size))


class _Exactly:
    """A file that may grow or shrink while archived, read as exactly ``size`` bytes."""

    def __init__(self, fh: IO[bytes], size: int) -> None:
        self._fh, self._left = fh, size

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        data = self._fh.read(n)
        data += b"\0" * (n - len(data))
        self._left -= n
        return data


class _Chunks:
    """File-like object for tarfile in a worker thread; hands on 1 MiB chunks."""

    def __init__(self, sink: Callable[[bytes], None]) -> None:
        self._sink = sink
        self._buf = bytearray()

    def write(self, data: bytes) -> int:
        self._buf += data
        if len(self._buf) >= 1 << 20:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if self._buf:
            data, self._buf = bytes(self._buf), bytearray()
            self._sink(data)

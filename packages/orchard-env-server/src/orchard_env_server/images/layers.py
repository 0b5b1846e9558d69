"""Layers applied to a root directory, safely: the one place a hostile image meets the disk.

Rules (docs/images.md, "Layer application"):

- A member named absolutely or with a ``..`` component is refused (``BadImage``).
- Every path is resolved from the root's fd with ``openat2(RESOLVE_IN_ROOT)``: a symlink
  on the way (``etc -> /elsewhere``) resolves as it would inside the sandbox, never above
  the root. The last component is never followed: an existing entry there is removed
  (``unlinkat``, ``rmtree`` by fds) and the new one created ``O_EXCL | O_NOFOLLOW``, so no
  write goes through a link planted by an earlier member or layer.
- Hard links are made with ``linkat`` from a target resolved the same way (an absolute
  link name counts from the root); symlinks are created as they are (their targets only
  mean something inside the sandbox).
- Whiteouts: ``.wh.NAME`` removes NAME of lower layers, ``.wh..wh..opq`` empties its
  directory of what lower layers put there; other ``.wh..wh.*`` entries are ignored.
- Device nodes are skipped (counted); FIFOs are made. Modes (setuid/setgid included),
  mtimes and, when running as root, owners are kept; xattrs are dropped.
- Directories are made 0700 while layers are applied (so a non-root unpacker can still
  write into a 0555 directory of a lower layer) and get their own mode, owner and mtime
  in ``finish()``, deepest first.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast

import attrs

from orchard_env_agent.anchored import open_at

from .blobs import Readable
from .errors import BadImage
from .files import Removed, remove_entry

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_CHUNK = 1 << 20
# An error of these kinds while applying a member is the layer's fault, not the machine's.
_LAYER_ERRNOS = {
    errno.ENOENT,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.ELOOP,
    errno.EEXIST,
    errno.ENAMETOOLONG,
    errno.EPERM,
    errno.EMLINK,
    errno.EXDEV,
    errno.EINVAL,
    errno.ENOTEMPTY,
}


@attrs.define
class LayerStats:
    """What applying one layer did."""

    entries: int = 0
    whiteouts: int = 0
    skipped_devices: int = 0
    skipped_other: int = 0


@attrs.define
class _DirMeta:
    mode: int
    uid: int
    gid: int
    mtime_ns: int | None


def clean_name(name: str, what: str) -> str:
    """A member name as a root-relative path without ``.``/empty parts ('' is the root)."""
    if name.startswith("/"):
        raise BadImage(f"{what}: member {name!r} has an absolute name")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BadImage(f"{what}: member {name!r} has a '..' component")
    if "\0" in name:
        raise BadImage(f"{what}: member {name!r} has a NUL byte")
    return "/".join(parts)


class LayerStream:
    """A layer blob read as its uncompressed tar (gzip or plain, told by its first bytes),
    hashing what it yields: ``diff_id()`` after ``drain()`` is the layer's uncompressed digest."""

    def __init__(self, src: IO[bytes], what: str) -> None:
        self._src = src
        self._what = what
        self._hash = hashlib.sha256()
        self._buf = b""  # decompressed, not yet read from ``_pos`` on
        self._pos = 0
        self._pending = src.read(4)  # input not yet decompressed
        self._zlib: zlib._Decompress | None = None
        self.yielded = 0
        if self._pending[:2] == b"\x1f\x8b":
            self._zlib = zlib.decompressobj(wbits=31)
        elif self._pending == b"\x28\xb5\x2f\xfd":
            raise BadImage(f"{what}: zstd-compressed layers are not supported (gzip or plain tar)")
        elif self._pending[:3] == b"BZh" or self._pending == b"\xfd7zX":
            raise BadImage(f"{what}: bzip2/xz-compressed layers are not supported")

    def _input(self, n: int) -> bytes:
        data = self._pending or self._src.read(n)
        self._pending = b""
        return data

    def _inflate(self) -> bytes:
        """The next decompressed chunk; b"" at the end of the input."""
        assert self._zlib is not None
        while True:
            d = self._zlib
            if d.unconsumed_tail:
                out = d.decompress(d.unconsumed_tail, _CHUNK)
            else:
                data = self._input(_CHUNK)
                if not data:
                    if not d.eof:
                        raise BadImage(f"{self._what}: the gzip stream is truncated")
                    return b""
                if d.eof:  # another gzip member follows (or padding)
                    if not data.strip(b"\0"):
                        continue
                    d = self._zlib = zlib.decompressobj(wbits=31)
                out = d.decompress(data, _CHUNK)
            if d.eof and d.unused_data:
                self._pending = d.unused_data
            if out:
                return out

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (fewer is not the end; b"" is)."""
        if n < 0:
            n = _CHUNK
        if self._zlib is None:
            out = self._input(n)
        else:
            if self._pos >= len(self._buf):
                try:
                    self._buf, self._pos = self._inflate(), 0
                except zlib.error as exc:
                    raise BadImage(f"{self._what}: corrupt gzip data: {exc}") from None
            out = self._buf[self._pos : self._pos + n]
            self._pos += len(out)
        self._hash.update(out)
        self.yielded += len(out)
        return out

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass

    def diff_id(self) -> str:
        return "sha256:" + self._hash.hexdigest()


class RootBuilder:
    """Applies layers, bottom first, to an empty directory ``root``; then ``finish()``."""

    def __init__(self, root: Path, keep_owners: bool | None = None) -> None:
        self._root = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self._keep_owners = os.geteuid() == 0 if keep_owners is None else keep_owners
        self._dirs: dict[str, _DirMeta] = {"": _DirMeta(0o755, 0, 0, None)}
        self._fds: dict[str, int] = {}  # resolved directories (O_PATH), dropped on removals
        self._stale: list[int] = []  # fds dropped from the cache, closed after the member
        self._layer: set[str] = set()  # paths this layer has put in place

    def __enter__(self) -> RootBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._forget_fds()
        if self._root >= 0:
            os.close(self._root)
            self._root = -1

    # -- layers

    def apply(self, stream: Readable, what: str = "layer") -> LayerStats:
        """Apply one uncompressed tar stream (see the module doc for the rules)."""
        stats = LayerStats()
        self._layer = set()
        try:
            tf = tarfile.open(  # noqa: SIM115 (closed by the with below)
                fileobj=cast(IO[bytes], stream),
                mode="r|",
                encoding="utf-8",
                errors="surrogateescape",
            )
        except tarfile.ReadError as exc:
            if getattr(stream, "yielded", 1) == 0:
                return stats  # an empty blob: an empty layer
            raise BadImage(f"{what}: not a tar archive: {exc}") from None
        try:
            with tf:
                while (member := tf.next()) is not None:
                    tf.members.clear()  # type: ignore[attr-defined]  # streamed: no index
                    self._member(tf, member, what, stats)
        except (tarfile.TarError, EOFError) as exc:
            raise BadImage(f"{what}: corrupt tar archive: {exc}") from None
        finally:
            self._forget_fds()
        return stats

    def _member(
        self, tf: tarfile.TarFile, m: tarfile.TarInfo, what: str, stats: LayerStats
    ) -> None:
        path = clean_name(m.name, what)
        base = path.rpartition("/")[2]
        try:
            if base.startswith(WHITEOUT):
                stats.whiteouts += 1
                self._whiteout(path, what)
                return
            if m.ischr() or m.isblk():
                stats.skipped_devices += 1
                return
            if not (m.isreg() or m.isdir() or m.issym() or m.islnk() or m.isfifo()):
                stats.skipped_other += 1
                return
            stats.entries += 1
            if not path:
                if not m.isdir():
                    raise BadImage(f"{what}: the root entry is not a directory")
                self._dirs[""] = self._meta(m)
                return
            self._mark(path)
            if m.isdir():
                self._dir(path, m)
            elif m.isreg():
                self._file(tf, path, m)
            elif m.issym():
                self._symlink(path, m)
            elif m.islnk():
                self._hardlink(path, m, what)
            else:
                self._fifo(path, m)
        except OSError as exc:
            if exc.errno in _LAYER_ERRNOS:
                raise BadImage(f"{what}: cannot apply {m.name!r}: {exc.strerror}") from None
            raise
        except ValueError as exc:  # an embedded NUL in a link name
            raise BadImage(f"{what}: cannot apply {m.name!r}: {exc}") from None
        finally:
            while self._stale:
                os.close(self._stale.pop())

    def _mark(self, path: str) -> None:
        while path and path not in self._layer:
            self._layer.add(path)
            path = path.rpartition("/")[0]

    def _meta(self, m: tarfile.TarInfo) -> _DirMeta:
        return _DirMeta(m.mode & 0o7777, m.uid, m.gid, _ns(m.mtime))

    def _dir(self, path: str, m: tarfile.TarInfo) -> None:
        parent, name = self._parent(path)
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                self._remove(parent, name, path)
                os.mkdir(name, 0o700, dir_fd=parent)
        self._dirs[path] = self._meta(m)

    def _file(self, tf: tarfile.TarFile, path: str, m: tarfile.TarInfo) -> None:
        parent, name = self._parent(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, 0o600, dir_fd=parent)
        except FileExistsError:
            self._remove(parent, name, path)
            fd = os.open(name, flags, 0o600, dir_fd=parent)
        try:
            src = tf.extractfile(m)
            if src is not None and m.size:
                with src:
                    while chunk := src.read(_CHUNK):
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(fd, view) :]
            if self._keep_owners:
                _chown(os.fchown, fd, m.uid, m.gid)
            os.fchmod(fd, m.mode & 0o7777)
            mtime = _ns(m.mtime)
            if mtime is not None:
                os.utime(fd, ns=(mtime, mtime))
        finally:
            os.close(fd)

    def _symlink(self, path: str, m: tarfile.TarInfo) -> None:
        parent, name = self._parent(path)
        try:
            os.symlink(m.linkname, name, dir_fd=parent)
        except FileExistsError:
            self._remove(parent, name, path)
            os.symlink(m.linkname, name, dir_fd=parent)
        if self._keep_owners:
            _chown(os.chown, name, m.uid, m.gid, dir_fd=parent, follow_symlinks=False)
        mtime = _ns(m.mtime)
        if mtime is not None:
            os.utime(name, ns=(mtime, mtime), dir_fd=parent, follow_symlinks=False)

    def _hardlink(self, path: str, m: tarfile.TarInfo, what: str) -> None:
        target = clean_name(m.linkname.lstrip("/"), what)
        if not target:
            raise BadImage(f"{what}: hard link {m.name!r} to the root")
        if target == path:
            return
        tdir, _, tname = target.rpartition("/")
        try:
            tparent = self._dir_fd(tdir, create=False)
        except FileNotFoundError:
            raise BadImage(f"{what}: hard link {m.name!r} to missing {m.linkname!r}") from None
        parent, name = self._parent(path)
        try:
            os.link(tname, name, src_dir_fd=tparent, dst_dir_fd=parent, follow_symlinks=False)
        except FileExistsError:
            self._remove(parent, name, path)
            os.link(tname, name, src_dir_fd=tparent, dst_dir_fd=parent, follow_symlinks=False)

    def _fifo(self, path: str, m: tarfile.TarInfo) -> None:
        parent, name = self._parent(path)
        try:
            os.mkfifo(name, 0o600, dir_fd=parent)
        except FileExistsError:
            self._remove(parent, name, path)
            os.mkfifo(name, 0o600, dir_fd=parent)
        if self._keep_owners:
            _chown(os.chown, name, m.uid, m.gid, dir_fd=parent, follow_symlinks=False)
        # Opening a FIFO for fchmod would block: its O_PATH fd is changed through /proc.
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        try:
            os.chmod(f"/proc/self/fd/{fd}", m.mode & 0o7777)
        finally:
            os.close(fd)

    def _whiteout(self, path: str, what: str) -> None:
        dirpath, _, base = path.rpartition("/")
        if base == OPAQUE:
            try:
                fd = open_at(self._root, dirpath, os.O_RDONLY | os.O_DIRECTORY)
            except (FileNotFoundError, NotADirectoryError):
                return
            try:
                self._opaque(fd, dirpath)
            finally:
                os.close(fd)
            return
        if base.startswith(WHITEOUT + WHITEOUT):
            return  # aufs metadata (.wh..wh.plnk and the like)
        victim = base[len(WHITEOUT) :]
        if victim in ("", ".", ".."):
            raise BadImage(f"{what}: invalid whiteout {path!r}")
        vpath = f"{dirpath}/{victim}" if dirpath else victim
        if vpath in self._layer:
            return  # a whiteout hides lower layers only
        try:
            parent = self._dir_fd(dirpath, create=False)
        except (FileNotFoundError, NotADirectoryError):
            return
        self._remove(parent, victim, vpath, missing_ok=True)

    def _opaque(self, fd: int, dirpath: str) -> None:
        """Remove what lower layers put under ``fd`` (``dirpath``); keep this layer's."""
        for name in os.listdir(fd):
            child = f"{dirpath}/{name}" if dirpath else name
            if child not in self._layer:
                self._remove(fd, name, child, missing_ok=True)
                continue
            with contextlib.suppress(OSError):
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                try:
                    self._opaque(sub, child)
                finally:
                    os.close(sub)

    # -- paths

    def _parent(self, path: str) -> tuple[int, str]:
        parent, _, name = path.rpartition("/")
        return self._dir_fd(parent, create=True), name

    def _dir_fd(self, path: str, create: bool) -> int:
        """An O_PATH fd of directory ``path`` resolved in the root (made if ``create``)."""
        fd = self._fds.get(path)
        if fd is not None:
            return fd
        try:
            fd = open_at(self._root, path, os.O_PATH | os.O_DIRECTORY)
        except FileNotFoundError:
            if not create:
                raise
            up, _, name = path.rpartition("/")
            upfd = self._dir_fd(up, create=True)
            with contextlib.suppress(FileExistsError):  # a dangling link: open_at says so
                os.mkdir(name, 0o700, dir_fd=upfd)
                self._dirs[path] = _DirMeta(0o755, 0, 0, None)
            fd = open_at(self._root, path, os.O_PATH | os.O_DIRECTORY)
        if len(self._fds) >= 512:
            self._forget_fds()
        self._fds[path] = fd
        return fd

    def _forget_fds(self) -> None:
        for fd in [*self._fds.values(), *self._stale]:
            os.close(fd)
        self._fds.clear()
        self._stale.clear()

    def _remove(self, parent: int, name: str, path: str, missing_ok: bool = False) -> None:
        """Remove entry ``name`` of ``parent`` (never following it), whatever it is."""
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            if missing_ok:
                return
            raise
        if stat.S_ISDIR(st.st_mode):
            remove_entry(parent, name, Removed())
            prefix = path + "/"
            for key in [k for k in self._dirs if k == path or k.startswith(prefix)]:
                del self._dirs[key]
        else:
            os.unlink(name, dir_fd=parent)
        if not stat.S_ISREG(st.st_mode):
            # A cached directory could have been this one, inside it or reached through it.
            # The caller may still hold one of them (its parent): closed after the member.
            self._stale.extend(self._fds.values())
            self._fds.clear()

    # -- the end

    def finish(self) -> None:
        """Give every directory its mode, owner and mtime (deepest first)."""
        self._forget_fds()
        for path in sorted(self._dirs, key=lambda p: -p.count("/") - bool(p)):
            meta = self._dirs[path]
            try:
                fd = self._open_dir(path)
            except OSError:
                continue  # replaced by a non-directory meanwhile: nothing to set
            try:
                if self._keep_owners:
                    _chown(os.fchown, fd, meta.uid, meta.gid)
                os.fchmod(fd, meta.mode)
                if meta.mtime_ns is not None:
                    os.utime(fd, ns=(meta.mtime_ns, meta.mtime_ns))
            finally:
                os.close(fd)
        self._dirs.clear()

    def _open_dir(self, path: str) -> int:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        if not path:
            return os.open(".", flags, dir_fd=self._root)
        up, _, name = path.rpartition("/")
        parent = open_at(self._root, up, os.O_PATH | os.O_DIRECTORY)
        try:
            return os.open(name, flags, dir_fd=parent)
        finally:
            os.close(parent)


def _ns(mtime: float) -> int | None:
    try:
        return int(mtime * 1_000_000_000)
    except (OverflowError, ValueError):
        return None


def _chown(call: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """Owners are kept where this process may set them (root on the host); ids a user
    namespace does not map are left as they are."""
    try:
        call(*args, **kwargs)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EPERM):
            raise

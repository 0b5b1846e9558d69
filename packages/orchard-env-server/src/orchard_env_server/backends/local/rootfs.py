"""Root filesystems a local create names by host path, under directories the operator allowed.

Such a tree becomes the read-only lower layer of the sandbox's root, id-mapped onto its
uid range: its root-owned files are the sandbox's root's. So a tenant may name only trees
strictly under an allowed directory (``--local-rootfs-dir``), and the check cannot be
raced:

- At start every allowed directory must be an existing directory other than ``/``,
  owned by root (or this server's user) and writable by no one else, and so must every
  directory above it unless it is sticky (``/tmp``, ``/var/tmp``): then no one else can
  swap it or what it holds for a link.
- At create the path is opened from an fd of its allowed directory with
  ``openat2(RESOLVE_IN_ROOT)`` (``anchored.open_at``): a link or ``..`` on the way resolves
  as if the allowed directory were ``/``, never above it. What was opened is checked again
  by fd (never the state dir or the image store, nor a directory holding them), and the
  sandbox's root is made from that fd, not from the path.
- An archive is unpacked from that fd by the image store's layer applier (links resolved
  inside the new root), into the state dir, once per file version.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import attrs

from orchard_env_agent import anchored

from ...images import BadImage, ImageError
from ...images.files import remove_tree
from ...images.layers import LayerStream, RootBuilder
from ..base import BackendError, ImageUnavailable

FLAG = "--local-rootfs-dir"


@attrs.frozen
class OpenedRootfs:
    """A root filesystem resolved for one create: its path (for records and messages) and,
    for a directory, an open fd of it (the caller closes it) that the root is made from."""

    path: Path
    fd: int | None


class RootfsDirs:
    """The allowed directories, checked at start; opens what a create names under them."""

    def __init__(self, allowed: Sequence[Path], private: Sequence[Path], archives: Path) -> None:
        self._configured = list(allowed)
        # Each allowed directory, opened once at ``check``: no later rename of its path
        # can change what creates are resolved in.
        self._anchors: dict[Path, int] = {}
        self._private = [Path(os.path.realpath(p)) for p in private]
        self._archives = archives  # rootfs archives unpacked, named by file version

    def check(self) -> None:
        """Check the configured directories (at start): ``BackendError`` stops the server."""
        self.close()
        for configured in self._configured:
            real = checked_allowed_dir(configured)
            flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            self._anchors[real] = os.open(real, flags)

    def close(self) -> None:
        """Close the allowed directories' fds."""
        for fd in self._anchors.values():
            os.close(fd)
        self._anchors.clear()

    def permits(self, image: str) -> bool:
        """Whether ``image`` (an absolute path) lies strictly under an allowed directory,
        by its spelling: for sandboxes of an earlier run, made under other settings."""
        return self._base(image) is not None

    def _base(self, image: str) -> Path | None:
        if "\0" in image:
            return None
        lexical = Path(os.path.normpath(image))
        under = [d for d in self._anchors if lexical.is_relative_to(d) and lexical != d]
        return max(under, key=lambda d: len(d.parts), default=None)

    def open(self, image: str) -> OpenedRootfs:
        """The tree ``image`` names (blocking); ``ImageUnavailable`` when it may not be
        used (before anything about it is looked at) or is not there."""
        base = self._base(image)
        if base is None:
            raise _refused(image)
        relative = str(Path(os.path.normpath(image)).relative_to(base))
        try:  # O_PATH: a FIFO or a device is looked at, never opened
            fd = anchored.open_at(self._anchors[base], relative, os.O_PATH, same_mount=True)
        except (OSError, ValueError) as exc:  # ValueError: a name no file system can hold
            code = getattr(exc, "errno", None)
            if code in (errno.ENOENT, errno.ENOTDIR):
                raise ImageUnavailable(
                    "not_found",
                    f"local backend: no root filesystem directory or archive at {image!r}",
                ) from None
            if code == errno.EXDEV:
                raise ImageUnavailable(
                    "invalid", f"image {image!r}: it lies across a mount point"
                ) from None
            raise _refused(image) from None
        try:
            real = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if real in self._anchors or any(
                real.is_relative_to(p) or p.is_relative_to(real) for p in self._private
            ):
                raise _refused(image)
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                return OpenedRootfs(real, fd)
            if not stat.S_ISREG(st.st_mode):
                raise ImageUnavailable(
                    "invalid", f"image {image!r}: neither a directory nor a regular file"
                )
            unpacked = self._unpacked(_reopened(fd, st), real)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return OpenedRootfs(unpacked, None)

    def _unpacked(self, fd: int, path: Path) -> Path:
        """The archive open for reading at ``fd`` unpacked under the state dir (once);
        closes ``fd``."""
        with os.fdopen(fd, "rb") as archive:
            return self._unpack(archive, path)

    def _unpack(self, archive: BinaryIO, path: Path) -> Path:
        st = os.fstat(archive.fileno())
        version = f"{path}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
        target = self._archives / hashlib.sha256(version.encode()).hexdigest()[:16]
        if target.is_dir():
            return target
        self._archives.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = self._archives / f".{target.name}.{secrets.token_hex(4)}"
        partial.mkdir(mode=0o700)
        try:
            with RootBuilder(partial) as builder:
                stream = LayerStream(archive, f"archive {path}")
                builder.apply(stream, f"archive {path}")
                builder.finish()
        except (OSError, ImageError) as exc:
            remove_tree(partial)
            why = exc if isinstance(exc, BadImage) else f"cannot unpack it: {exc}"
            raise BackendError(f"image archive {path}: {why}") from exc
        try:
            partial.rename(target)
        except OSError:
            remove_tree(partial)  # another create won the race
        return target


def _reopened(fd: int, expected: os.stat_result) -> int:
    """A regular file open at ``fd`` (O_PATH) opened again for reading, through its fd:
    without blocking or taking a terminal, and checked to be the same file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    readable = os.open(f"/proc/self/fd/{fd}", flags)
    st = os.fstat(readable)
    if (st.st_dev, st.st_ino) != (expected.st_dev, expected.st_ino):
        os.close(readable)
        raise OSError(errno.ESTALE, "the archive changed while it was opened")
    return readable


def checked_allowed_dir(path: Path) -> Path:
    """``path`` resolved, if it may be an allowed directory (see the module doc); else
    ``BackendError`` saying why, which stops the server at start."""
    real = Path(os.path.realpath(path))
    if real == Path("/"):
        raise BackendError(f"{FLAG} {path}: / would let tenants run any host directory")
    if not real.is_dir():
        raise BackendError(f"{FLAG} {path}: not an existing directory")
    trusted = {0, os.geteuid()}
    for current in (real, *real.parents):
        st = os.stat(current)
        if current != real and st.st_mode & stat.S_ISVTX and st.st_uid in trusted:
            continue  # sticky and ours: no one else can move what root put in it
        if st.st_uid not in trusted or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise BackendError(
                f"{FLAG} {path}: {current} is owned by uid {st.st_uid} with mode "
                f"{stat.S_IMODE(st.st_mode):o}: someone other than root could write it "
                "and change what a tenant's image path leads to"
            )
    return real


def _refused(image: str) -> ImageUnavailable:
    return ImageUnavailable(
        "invalid",
        f"image {image[:200]!r}: a root filesystem named by path must lie under a directory "
        f"the operator allowed (orchard-env serve {FLAG} DIR); otherwise name a stored "
        "image (`orchard-env image pull REF`, `orchard-env image import FILE`)",
    )

"""A writable root filesystem per local sandbox over a shared, read-only image tree.

The image store unpacks an image once (owners as the image says: 0-based). A sandbox
needs its own writable copy, owned by its root, which is an unprivileged host uid range
(``uid_ranges``). Two ways, picked once at start by ``ImageRoots.probe``:

``overlay`` (the orchestrator is root, the kernel has id-mapped mounts): the image tree is
bound read-only with an id-mapping onto the sandbox's range (``open_tree`` +
``mount_setattr(MOUNT_ATTR_IDMAP)`` against a user namespace with the sandbox's map), and
an overlay of that with an upper directory of the sandbox's own is its ``/``. Nothing is
copied: a create costs a few mounts, and the disk holds only what the sandbox writes.

``copy`` (otherwise): the tree is copied (``cp -a``, reflinks where the file system has
them) and, as root, its owners shifted into the sandbox's range. Slower, but it works
everywhere.

The read-only id-mapped bind also guards the store: removing a sandbox's directory while
it is still mounted cannot delete the image's files.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Literal

from .uid_ranges import RANGE_SIZE

Mode = Literal["overlay", "copy"]

_libc = ctypes.CDLL(None, use_errno=True)
# The same numbers on x86_64 and aarch64 (the new mount API is in the common table).
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, os.O_CLOEXEC
_AT_EMPTY_PATH, _AT_FDCWD = 0x1000, -100
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
_MOUNT_ATTR_IDMAP = 0x100000
_MS_NOSUID, _MS_NODEV = 0x2, 0x4
_MNT_DETACH = 0x2
_USERNS_TIMEOUT_S = 5.0

# Names inside a sandbox's directory (see ``LocalBackend``): the merged root and its parts.
ROOT, LOWER, UPPER, WORK = "root", "image-lower", "image-upper", "image-work"


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


class ImageRoots:
    """Makes and removes sandboxes' root filesystems from unpacked images."""

    def __init__(self) -> None:
        self.mode: Mode = "copy"
        self.why_copy = "not probed yet"

    def probe(self, scratch: Path) -> None:
        """Pick ``overlay`` if this process can make one here (tried on a tiny tree in
        ``scratch``), else ``copy``, with the reason in ``why_copy``."""
        if os.geteuid() != 0:
            self.mode, self.why_copy = "copy", "the orchestrator is not root (no mounts)"
            return
        if shutil.which("unshare") is None:
            self.mode, self.why_copy = "copy", "util-linux's unshare is not installed"
            return
        home = scratch / f"probe-{os.getpid()}"
        shutil.rmtree(home, ignore_errors=True)
        try:
            (home / "image" / "etc").mkdir(parents=True)
            self.mode = "overlay"
            self.make(home, home / "image", 2**31)  # any unused range will do
            (home / ROOT / "etc" / "written").write_text("")  # an upper layer that works
            self.why_copy = ""
        except OSError as exc:
            self.mode, self.why_copy = "copy", f"id-mapped overlay mounts do not work here: {exc}"
        finally:
            self.remove(home)
            shutil.rmtree(home, ignore_errors=True)

    def make(
        self, home: Path, image_root: Path, first_uid: int | None, tree_fd: int | None = None
    ) -> Path:
        """``home/root``: the sandbox's writable root over ``image_root`` (blocking), or
        over the directory open at ``tree_fd`` when given (a tree a tenant named: made
        from what was checked, never from its path again)."""
        root = home / ROOT
        tree = f"/proc/self/fd/{tree_fd}" if tree_fd is not None else str(image_root)
        if self.mode == "overlay" and first_uid is not None:
            self._overlay(home, tree, first_uid, tree_fd)
        elif tree_fd is not None:
            # cp walks path strings: a link swapped into the tree meanwhile (by anyone who
            # can write inside it) would be followed on the host.
            raise OSError(
                errno.EPERM,
                "a root filesystem named by path needs id-mapped overlay mounts, and here "
                f"{self.why_copy}: import it into the image store instead "
                "(`orchard-env image import`)",
            )
        else:
            self._copy(tree, root, first_uid)
        return root

    def remove(self, home: Path) -> None:
        """Unmount what ``make`` mounted in ``home`` (the directory itself stays).

        Tried on each mount point: an id-mapped bind is on the same device as its parent,
        so ``os.path.ismount`` cannot tell; the kernel's EINVAL can (not mounted there)."""
        failed: OSError | None = None
        for name in (ROOT, LOWER):
            path = home / name
            if _libc.umount2(os.fsencode(path), _MNT_DETACH) != 0:
                err = ctypes.get_errno()
                if err not in (errno.EINVAL, errno.ENOENT):
                    failed = failed or OSError(err, f"umount {path}: {os.strerror(err)}")
        if failed is not None:  # after trying every mount point
            raise failed

    # -- overlay --------------------------------------------------------------------
    def _overlay(self, home: Path, tree: str, first_uid: int, tree_fd: int | None) -> None:
        lower, upper, work, root = (home / n for n in (LOWER, UPPER, WORK, ROOT))
        for path in (lower, upper, work, root):
            path.mkdir(mode=0o755)
        st = os.fstat(tree_fd) if tree_fd is not None else os.stat(tree)
        os.chown(upper, _shifted(first_uid, st.st_uid), _shifted(first_uid, st.st_gid))
        upper.chmod(st.st_mode & 0o7777)
        userns = _userns_with_map(first_uid)
        try:
            _idmapped_bind(tree, tree_fd, lower, userns)
        finally:
            os.close(userns)
        options = f"lowerdir={lower},upperdir={upper},workdir={work}"
        try:
            _check(
                _libc.mount(
                    b"overlay",
                    os.fsencode(root),
                    b"overlay",
                    _MS_NOSUID | _MS_NODEV,
                    options.encode(),
                ),
                "mount overlay",
            )
        except OSError:
            self.remove(home)
            raise

    # -- copy -----------------------------------------------------------------------
    @staticmethod
    def _copy(tree: str, root: Path, first_uid: int | None) -> None:
        root.mkdir(mode=0o755)
        try:
            subprocess.run(  # "DIR/." copies what DIR holds into the root made above
                ["cp", "-a", "--one-file-system", "--reflink=auto", "--", f"{tree}/.", str(root)],
                check=True,
                capture_output=True,
            )
        except subprocess.CalledProcessError as exc:
            raise OSError(f"cannot copy the image: {exc.stderr.decode(errors='replace')}") from exc
        if first_uid is not None:
            _shift_owners(root, first_uid)


def _shift_owners(root: Path, first_uid: int) -> None:
    """Owners 0..65535 become the sandbox's range; others its ``nobody``."""

    for dirpath, dirnames, filenames in os.walk(root):
        for name in (dirpath, *(os.path.join(dirpath, n) for n in (*dirnames, *filenames))):
            st = os.lstat(name)
            mode = st.st_mode
            uid, gid = _shifted(first_uid, st.st_uid), _shifted(first_uid, st.st_gid)
            os.chown(name, uid, gid, follow_symlinks=False)
            if not os.path.islink(name):
                os.chmod(name, mode & 0o7777)  # chown clears setuid/setgid bits


def _shifted(first_uid: int, ident: int) -> int:
    """An image's owner id as the host id of a sandbox's range (beyond it: its nobody)."""
    return first_uid + (ident if 0 <= ident < RANGE_SIZE else 65534)


def _userns_with_map(first_uid: int) -> int:
    """An fd of a user namespace whose ids 0..65535 are host ``first_uid`` on: the shape
    of the sandbox's own, which does not exist yet when its root is made."""
    own = os.readlink("/proc/self/ns/user")
    proc = subprocess.Popen(
        ["unshare", "--user", "--", "cat"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + _USERNS_TIMEOUT_S
        while True:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{proc.pid}/ns/user") != own:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise OSError("could not make a user namespace for the id-mapping")
            time.sleep(0.0002)
        for kind in ("uid_map", "gid_map"):
            with open(f"/proc/{proc.pid}/{kind}", "w") as fh:
                fh.write(f"0 {first_uid} {RANGE_SIZE}\n")
        return os.open(f"/proc/{proc.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()


def _idmapped_bind(source: str, source_fd: int | None, target: Path, userns_fd: int) -> None:
    """Bind ``source`` (the directory open at ``source_fd`` if given) on ``target``
    read-only, its owners seen through ``userns_fd``."""
    flags = _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC  # not recursive: no mounts below it
    at, path = (source_fd, b"") if source_fd is not None else (_AT_FDCWD, os.fsencode(source))
    if source_fd is not None:
        flags |= _AT_EMPTY_PATH
    tree = _check(_libc.syscall(_SYS_OPEN_TREE, at, path, flags), f"open_tree {source}")
    try:
        attr = _MountAttr(
            _MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV,
            0,
            0,
            userns_fd,
        )
        _check(
            _libc.syscall(
                _SYS_MOUNT_SETATTR,
                tree,
                b"",
                _AT_EMPTY_PATH,
                ctypes.byref(attr),
                ctypes.sizeof(attr),
            ),
            "mount_setattr (id-mapping)",
        )
        _check(
            _libc.syscall(
                _SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, os.fsencode(target), _MOVE_MOUNT_F_EMPTY_PATH
            ),
            f"move_mount {target}",
        )
    finally:
        os.close(tree)

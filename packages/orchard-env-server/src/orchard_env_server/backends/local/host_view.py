"""What a local sandbox sees of its root filesystem: a list of mounts, built once per create.

One description serves two readers: ``bubblewrap`` turns it into bwrap arguments (the
sandbox's own view) and the local backend turns it into the agent's mount table (the file
API's view), so the two cannot disagree.

For the image ``host`` the view is minimal: the host's ``/usr`` and the ``/bin``, ``/sbin``
and ``/lib*`` entries, read-only; a curated copy of ``/etc`` (see ``curate_etc``); nothing
of ``/root``, ``/home``, ``/run``, ``/var``, ``/srv``, ``/mnt``, ``/media``, ``/opt``, the
orchestrator's state or any other sandbox. Extra host paths come only from the server's
``--local-host-path`` setting, read-only. Any other image gets a writable root of its own
(``image_roots``), not a view.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs

# Top-level host entries the image ``host`` shows (directories read-only, or symlinks).
HOST_SYSTEM_ENTRIES = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Names under /etc that are never shown, even when world-readable: credentials, host keys,
# the machine's identity and container/cluster configuration of the host.
_ETC_NEVER = {
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "passwd-",
    "group-",
    "subuid",
    "subuid-",
    "subgid",
    "subgid-",
    "sudoers",
    "sudoers.d",
    "ssh",
    "machine-id",
    "docker",
    "containerd",
    "kubernetes",
    "cni",
    "crio",
    "wireguard",
    "letsencrypt",
    "ipsec.secrets",
    "ppp",
    "openvpn",
    "pip.conf",
    "netrc",
    ".pwd.lock",
    "credstore",
    "credstore.encrypted",
    "krb5.keytab",
    "opasswd",
    "private",
    "system-connections",
    "orchard-env",
    "hostname",
    "hosts",
    "resolv.conf",
    "mtab",
}
_HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
RESOLV_SLIRP = "nameserver 10.0.2.3\n"  # slirp4netns's DNS forwarder
RESOLV_NONE = "# no network in this sandbox\n"


@attrs.frozen
class ViewMount:
    """One entry of a sandbox's filesystem view at ``dest``.

    Exactly one of: ``source`` (a host path bound there, read-only unless ``writable``),
    ``symlink`` (a link with that target) or ``tmpfs`` (an empty, private file system).
    """

    dest: str
    source: Path | None = None
    writable: bool = False
    symlink: str | None = None
    tmpfs: bool = False


def host_view(etc: Path, extra_paths: Sequence[Path], hide: Iterable[Path]) -> list[ViewMount]:
    """The image ``host``: system directories, the curated ``etc`` and ``extra_paths``."""
    view: list[ViewMount] = []
    for name in HOST_SYSTEM_ENTRIES:
        source = Path("/") / name
        if source.is_symlink():
            view.append(ViewMount(f"/{name}", symlink=os.readlink(source)))
        elif source.is_dir():
            view.append(ViewMount(f"/{name}", source=source))
    view.append(ViewMount("/etc", source=etc))
    view += [ViewMount(str(p), source=p) for p in extra_paths]
    return view + _masks(view, hide)


def _masks(view: list[ViewMount], hide: Iterable[Path]) -> list[ViewMount]:
    """Empty file systems over hidden host directories that a bound path would show."""
    masks = []
    for hidden in hide:
        for m in view:
            if m.source is None or not hidden.is_dir():
                continue
            with contextlib.suppress(ValueError):
                rest = hidden.resolve().relative_to(m.source.resolve())
                masks.append(ViewMount(str(Path(m.dest) / rest), tmpfs=True))
    return masks


def skeleton(view: Sequence[ViewMount], target: Path) -> None:
    """The sandbox root as the file API sees it outside any mount: the view's symlinks and
    an empty directory for each mount point (bwrap makes the same on its own root)."""
    for m in view:
        path = target / m.dest.lstrip("/")
        if m.symlink is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                path.symlink_to(m.symlink)
        else:
            path.mkdir(parents=True, exist_ok=True)


def curate_etc(states: Path, source: Path = Path("/etc")) -> Path:
    """A copy of the host's ``/etc`` that a sandbox may read: ``states/etc-<hash>``.

    Kept: world-readable files, directories and symlinks (a sandbox's root maps to an
    unprivileged host uid: what it could not read on the host it does not get here).
    Dropped: everything named in ``_ETC_NEVER`` at any depth, and ``passwd``/``group``
    entries of human accounts (uid/gid 1000 and up, but ``nobody``/``nogroup``), whose
    names and group memberships say who uses the host. ``hosts`` is generated; the
    sandbox's hostname and ``resolv.conf`` are set per sandbox.

    Copies are named by their content and never changed: a sandbox keeps its own bound
    while it lives, and an unchanged host ``/etc`` gives the same copy after a restart
    (``prune_etc`` removes the ones no sandbox uses).
    """
    partial = states / f".etc-{secrets.token_hex(4)}"
    partial.mkdir(mode=0o755, parents=True)
    try:
        _copy_readable(source, partial)
        for name in ("passwd", "group"):
            with contextlib.suppress(OSError):
                lines = (source / name).read_text().splitlines()
                kept = [_system_entry(line, 2, name == "group") for line in lines]
                (partial / name).write_text("".join(f"{line}\n" for line in kept if line))
        (partial / "hosts").write_text(_HOSTS)
        (partial / "resolv.conf").write_text(RESOLV_NONE)  # a network sandbox gets its own
        for name in ("passwd", "group", "hosts", "resolv.conf"):
            with contextlib.suppress(FileNotFoundError):
                (partial / name).chmod(0o644)
        target = states / f"etc-{_tree_hash(partial)}"
        if target.is_dir():
            shutil.rmtree(partial)
        else:
            partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return target


def prune_etc(states: Path, keep: set[Path]) -> None:
    """Remove the curated copies in ``states`` that are not in ``keep``."""
    for path in states.glob("etc-*"):
        if path not in keep:
            shutil.rmtree(path, ignore_errors=True)


def _tree_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        if path.is_symlink():
            digest.update(b"L" + os.readlink(path).encode())
        elif path.is_file():
            digest.update(b"F%o" % path.stat().st_mode + path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _system_entry(line: str, id_field: int, drop_members: bool) -> str:
    fields = line.split(":")
    try:
        ident = int(fields[id_field])
    except (IndexError, ValueError):
        return ""
    if 1000 <= ident < 65534:
        return ""
    if drop_members and len(fields) >= 4:
        fields[3] = ""
    return ":".join(fields)


def _copy_readable(src: Path, dst: Path) -> None:
    for entry in os.scandir(src):
        if entry.name in _ETC_NEVER:
            continue
        target = dst / entry.name
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                target.symlink_to(os.readlink(entry.path))
            elif stat.S_ISDIR(st.st_mode):
                if st.st_mode & 0o005 == 0o005:
                    target.mkdir(mode=0o755)
                    _copy_readable(Path(entry.path), target)
            elif stat.S_ISREG(st.st_mode) and st.st_mode & 0o004:
                shutil.copyfile(entry.path, target, follow_symlinks=False)
                target.chmod(stat.S_IMODE(st.st_mode) & 0o755)
        except OSError:
            continue  # vanished or unreadable: not shown

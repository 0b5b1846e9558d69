"""Listings of root trees, to compare an unpacked image with Docker's own view of it
(``docker export`` of a container created from the image)."""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
from pathlib import Path

from orchard_testing import docker

# What a container's init layer adds to its image (docker export shows them).
_DOCKER_ADDS = {
    ".dockerenv",
    "dev/console",
    "etc/hosts",
    "etc/hostname",
    "etc/resolv.conf",
    "etc/mtab",
}
_DOCKER_DIRS = {"dev", "dev/pts", "dev/shm", "dev/console", "proc", "sys", "etc"}

Entry = tuple[object, ...]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def tree_listing(root: Path) -> tuple[dict[str, Entry], list[set[str]]]:
    """{path: (kind, mode, uid, gid, what)} of a tree, and its groups of hard links."""
    out: dict[str, Entry] = {}
    inodes: dict[int, set[str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            rel = str(full.relative_to(root))
            st = full.lstat()
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", mode, st.st_uid, st.st_gid, None)
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", mode, st.st_uid, st.st_gid, os.readlink(full))
            elif stat.S_ISREG(st.st_mode):
                content = _digest(full.read_bytes())
                out[rel] = ("file", mode, st.st_uid, st.st_gid, (content, int(st.st_mtime)))
                if st.st_nlink > 1:
                    inodes.setdefault(st.st_ino, set()).add(rel)
            elif stat.S_ISFIFO(st.st_mode):
                out[rel] = ("fifo", mode, st.st_uid, st.st_gid, None)
            else:
                out[rel] = ("other", mode, st.st_uid, st.st_gid, None)
    return out, [group for group in inodes.values() if len(group) > 1]


def export_listing(archive: Path) -> tuple[dict[str, Entry], list[set[str]]]:
    """The same listing of a ``docker export`` tar (devices and Docker's additions left out)."""
    out: dict[str, Entry] = {}
    links: dict[str, set[str]] = {}
    with tarfile.open(archive) as tf:
        for m in tf:
            rel = m.name.strip("/").removeprefix("./")
            if not rel or rel in _DOCKER_ADDS or m.ischr() or m.isblk():
                continue
            if m.isdir():
                out[rel] = ("dir", m.mode & 0o7777, m.uid, m.gid, None)
            elif m.issym():
                out[rel] = ("link", 0o777, m.uid, m.gid, m.linkname)
            elif m.islnk():
                target = m.linkname.strip("/")
                out[rel] = out[target]
                group = links.setdefault(target, {target})
                group.add(rel)
                links[rel] = group
            elif m.isreg():
                fh = tf.extractfile(m)
                assert fh is not None
                content = _digest(fh.read())
                out[rel] = ("file", m.mode & 0o7777, m.uid, m.gid, (content, int(m.mtime)))
            elif m.isfifo():
                out[rel] = ("fifo", m.mode & 0o7777, m.uid, m.gid, None)
    groups = {id(g): g for g in links.values()}
    return out, list(groups.values())


def docker_export(image: str, into: Path) -> Path:
    """``docker export`` of a container created (not started) from ``image``."""
    container = docker("create", image, "/bin/true")
    try:
        target = into / "export.tar"
        docker("export", "-o", str(target), container)
    finally:
        docker("rm", "-f", container, check=False)
    return target


def differences(ours: dict[str, Entry], docker_view: dict[str, Entry]) -> list[str]:
    """Where an unpacked tree and Docker's view of the image disagree."""
    problems = []
    for path in sorted(set(ours) | set(docker_view)):
        mine, theirs = ours.get(path), docker_view.get(path)
        if mine == theirs:
            continue
        made_by_docker = path.split("/")[0] in ("dev", "proc", "sys") or path in _DOCKER_DIRS
        if (
            made_by_docker  # the init layer makes these directories (maybe newer)
            and theirs is not None
            and theirs[0] == "dir"
            and (mine is None or mine[0] == "dir")
        ):
            continue
        problems.append(f"{path}: ours {mine}, docker's {theirs}")
    return problems


def assert_unpacked_as_docker_shows(tree: Path, image: str, workdir: Path) -> None:
    """``tree`` holds what a container of local Docker image ``image`` starts with."""
    ours, our_links = tree_listing(tree)
    theirs, their_links = export_listing(docker_export(image, workdir))
    assert differences(ours, theirs) == []
    assert sorted(map(sorted, our_links)) == sorted(map(sorted, their_links))

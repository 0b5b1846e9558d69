"""Checking tar members before extraction, on any Python 3.11.

Python 3.11.4 added ``tarfile.data_filter``; the agent bundle carries Debian's 3.11.2,
which lacks it. There the same rules are applied here: no absolute names, nothing that
lands or links outside the destination, no device files, no setuid bits, no owners.
"""

from __future__ import annotations

import copy
import os
import tarfile

HAS_DATA_FILTER = hasattr(tarfile, "data_filter")


class RefusedMember(Exception):
    """A member that would escape the destination or is not plain data."""


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _check_fallback(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    root = os.path.realpath(dest)
    target = os.path.realpath(os.path.join(root, member.name))
    if not _inside(root, target):
        raise RefusedMember(f"{member.name!r} would be extracted outside the destination")
    if member.isdev() or member.isfifo():
        raise RefusedMember(f"{member.name!r} is a special file")
    if member.issym() or member.islnk():
        if os.path.isabs(member.linkname):
            raise RefusedMember(f"{member.name!r} links to an absolute path")
        base = os.path.dirname(target) if member.issym() else root
        if not _inside(root, os.path.realpath(os.path.join(base, member.linkname))):
            raise RefusedMember(f"{member.name!r} links outside the destination")
    clean = copy.copy(member)  # (TarInfo.replace is 3.11.4+ too)
    clean.uid, clean.gid, clean.uname, clean.gname = os.getuid(), os.getgid(), "", ""
    if member.isreg() or member.isdir():
        mode = member.mode & 0o755  # no setuid/setgid/sticky, no group/other write
        clean.mode = mode | (0o600 if member.isreg() else 0o700)
    return clean


def check_members(members: list[tarfile.TarInfo], dest: str) -> list[tarfile.TarInfo]:
    """The members as they may be extracted into ``dest``; RefusedMember on the first bad one."""
    checked = []
    for member in members:
        if member.name.startswith("/") or (member.islnk() and member.linkname.startswith("/")):
            raise RefusedMember(f"archive member {member.name!r} is absolute")
        if HAS_DATA_FILTER:
            try:
                tarfile.data_filter(member, dest)
            except tarfile.FilterError as exc:
                raise RefusedMember(str(exc)) from None
            checked.append(member)
        else:
            checked.append(_check_fallback(member, dest))
    return checked

"""Tar member checks, both with Python's data filter and with the 3.11.2 fallback."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from orchard_env_agent import anchored, tarsafe

pytestmark = pytest.mark.fast


@pytest.fixture(params=["data_filter", "fallback"])
def mode(request, monkeypatch):
    if request.param == "fallback":
        monkeypatch.setattr(tarsafe, "HAS_DATA_FILTER", False)
    elif not tarsafe.HAS_DATA_FILTER:
        pytest.skip("this Python has no tarfile.data_filter")
    return request.param


def _member(name, kind=tarfile.REGTYPE, linkname="", mode=0o644):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    return info


@pytest.mark.parametrize(
    "member",
    [
        _member("../outside"),
        _member("a/../../outside"),
        _member("/etc/passwd"),
        _member("link", tarfile.SYMTYPE, "/etc"),
        _member("d/link", tarfile.SYMTYPE, "../../x"),
        _member("hard", tarfile.LNKTYPE, "../x"),
        _member("dev", tarfile.CHRTYPE),
    ],
    ids=[
        "dotdot",
        "nested-dotdot",
        "absolute",
        "abs-symlink",
        "out-symlink",
        "out-hardlink",
        "device",
    ],
)
def test_escapes_and_special_files_are_refused(mode, member, tmp_path):
    with pytest.raises(tarsafe.RefusedMember):
        tarsafe.check_members([member], str(tmp_path))


def test_plain_members_pass_and_lose_setuid_bits(mode, tmp_path):
    members = [
        _member("dir", tarfile.DIRTYPE, mode=0o755),
        _member("dir/tool", mode=0o4777),
        _member("dir/rel", tarfile.SYMTYPE, "tool"),
    ]
    checked = tarsafe.check_members(members, str(tmp_path))
    assert [m.name for m in checked] == ["dir", "dir/tool", "dir/rel"]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for m in members:
            tf.addfile(m, io.BytesIO(b"") if m.isreg() else None)
    buf.seek(0)
    anchor = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        with tarfile.open(fileobj=buf) as tf:
            anchored.extract(anchor, ".", tf, tarsafe.check_members(tf.getmembers(), "/dest"))
    finally:
        os.close(anchor)
    assert (tmp_path / "dir" / "tool").stat().st_mode & 0o7777 == 0o755
    assert (tmp_path / "dir" / "rel").is_symlink()

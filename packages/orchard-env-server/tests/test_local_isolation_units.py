"""The local backend's isolation, its pure parts: the host view, uid ranges, bwrap's argv."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchard_env_server.backends.local.bubblewrap import HolderSpec, holder_argv
from orchard_env_server.backends.local.host_view import (
    ViewMount,
    curate_etc,
    host_view,
    prune_etc,
    skeleton,
)
from orchard_env_server.backends.local.uid_ranges import FIRST_UID, RANGE_SIZE, UidRanges

pytestmark = pytest.mark.fast


def _fake_etc(root: Path) -> Path:
    etc = root / "etc"
    (etc / "ssl" / "private").mkdir(parents=True)
    (etc / "ssl" / "private" / "key.pem").write_text("KEY")
    (etc / "ssl" / "certs").mkdir()
    (etc / "ssl" / "certs" / "ca.pem").write_text("CA")
    (etc / "shadow").write_text("root:$6$secret")
    (etc / "ssh").mkdir()
    (etc / "ssh" / "ssh_host_ed25519_key.pub").write_text("pub")
    (etc / "os-release").symlink_to("../usr/lib/os-release")
    (etc / "secret.conf").write_text("token")
    (etc / "secret.conf").chmod(0o600)
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/bash\n"
        "nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n"
    )
    (etc / "group").write_text("root:x:0:\nsudo:x:27:alice\nalice:x:1000:\n")
    return etc


def test_the_curated_etc_keeps_what_anyone_may_read_and_no_secrets(tmp_path):
    out = curate_etc(tmp_path / "states", _fake_etc(tmp_path))
    assert (out / "ssl" / "certs" / "ca.pem").read_text() == "CA"
    assert os.readlink(out / "os-release") == "../usr/lib/os-release"
    for gone in ("shadow", "ssh", "secret.conf", "ssl/private"):
        assert not (out / gone).exists(), gone
    assert "alice" not in (out / "passwd").read_text()
    assert "nobody" in (out / "passwd").read_text()
    assert (out / "group").read_text() == "root:x:0:\nsudo:x:27:\n"
    assert "localhost" in (out / "hosts").read_text()
    assert (out / "resolv.conf").exists()  # the mount point a network sandbox's resolver covers
    # Named by content: the same host /etc gives the same copy, a changed one a new copy,
    # and the old one stays for the sandboxes bound to it until pruned.
    assert curate_etc(tmp_path / "states", _fake_etc(tmp_path / "same")) == out
    (tmp_path / "etc" / "motd").write_text("changed")
    changed = curate_etc(tmp_path / "states", tmp_path / "etc")
    assert changed != out and out.is_dir()
    assert sorted(p.name for p in (tmp_path / "states").iterdir()) == sorted(
        [out.name, changed.name]
    )
    prune_etc(tmp_path / "states", {changed})
    assert not out.exists() and changed.is_dir()


def test_the_host_view_shows_system_dirs_etc_and_extra_paths_only(tmp_path):
    extra = tmp_path / "data"
    extra.mkdir()
    view = host_view(tmp_path / "etc", [extra], hide=[])
    dests = {m.dest for m in view}
    assert {"/usr", "/etc", str(extra)} <= dests
    assert not dests & {"/root", "/home", "/var", "/run", "/srv", "/opt", "/mnt", "/media"}
    assert all(not m.writable for m in view)
    assert next(m for m in view if m.dest == "/etc").source == tmp_path / "etc"


def test_a_hidden_directory_under_a_bound_one_is_masked(tmp_path):
    (tmp_path / "root" / "state" / "orchard").mkdir(parents=True)
    (tmp_path / "root" / "bin").mkdir()
    extra = tmp_path / "root"
    view = host_view(tmp_path / "etc", [extra], hide=[extra / "state" / "orchard"])
    assert ViewMount(str(extra / "state" / "orchard"), tmpfs=True) in view
    assert ViewMount(str(extra), source=extra) in view


def test_the_skeleton_has_the_views_links_and_mount_points(tmp_path):
    view = [ViewMount("/bin", symlink="usr/bin"), ViewMount("/usr", source=Path("/usr"))]
    skeleton(view, tmp_path / "skel")
    assert os.readlink(tmp_path / "skel" / "bin") == "usr/bin"
    assert (tmp_path / "skel" / "usr").is_dir()


def test_uid_ranges_are_distinct_released_and_reclaimed_when_stale(tmp_path):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    one, two = UidRanges(tmp_path / "reg"), UidRanges(tmp_path / "reg")  # two orchestrators
    one.prepare()
    a, b = one.claim(a_dir), two.claim(b_dir)
    assert a >= FIRST_UID and b >= FIRST_UID and abs(a - b) >= RANGE_SIZE
    one.release(a, b_dir)  # not its claim: kept
    assert two.claim(a_dir) not in (a, b)
    b_dir.rmdir()  # a crashed orchestrator's sandbox dir is gone: its range is free again
    fresh = UidRanges(tmp_path / "reg")
    claimed = {fresh.claim(a_dir) for _ in range(3)}
    assert b in claimed


def test_the_holder_runs_in_a_user_namespace_with_staged_sources(tmp_path):
    view = [
        ViewMount("/bin", symlink="usr/bin"),
        ViewMount("/usr", source=Path("/usr")),
        ViewMount("/state", tmpfs=True),
    ]
    spec = HolderSpec(
        "s1",
        "/usr/bin/bwrap",
        view,
        tmp_path / "w",
        tmp_path / "t",
        seccomp=tmp_path / "f.bpf",
        resolv_conf=None,
        uid=FIRST_UID,
    )
    argv = holder_argv(
        spec, ["/stage/0", "/stage/1", "/stage/2"], {"seccomp": 5, "block": 6, "info": 7}
    )
    joined = " ".join(argv)
    assert "--unshare-user --userns-block-fd 6 --uid 0 --gid 0 --seccomp 5" in joined
    assert "--ro-bind /stage/0 /usr" in joined and "--symlink usr/bin /bin" in joined
    assert "--bind /stage/1 /workspace --bind /stage/2 /tmp" in joined
    assert "--tmpfs /state" in joined and "--share-net" not in argv
    assert "--unshare-net" in argv and argv[argv.index("--info-fd") + 1] == "7"

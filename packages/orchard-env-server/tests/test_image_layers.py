"""Layer application, with layers built in Python: whiteouts, opaque directories, links,
metadata, and hostile layers that try to write, link or delete outside the root."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from pathlib import Path

import pytest

from orchard_env_server.images import BadImage
from orchard_env_server.images.layers import LayerStats, LayerStream, RootBuilder

fast = pytest.mark.fast
MTIME = 1_600_000_000


def _info(name: str, kind: bytes, **attrs: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mtime = MTIME
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    for key, value in attrs.items():
        setattr(info, key, value)
    return info


def F(name: str, data: bytes = b"", **attrs: object) -> tuple[tarfile.TarInfo, bytes]:
    return _info(name, tarfile.REGTYPE, size=len(data), **attrs), data


def D(name: str, **attrs: object) -> tuple[tarfile.TarInfo, bytes]:
    return _info(name, tarfile.DIRTYPE, **attrs), b""


def S(name: str, target: str) -> tuple[tarfile.TarInfo, bytes]:
    return _info(name, tarfile.SYMTYPE, linkname=target, mode=0o777), b""


def H(name: str, target: str) -> tuple[tarfile.TarInfo, bytes]:
    return _info(name, tarfile.LNKTYPE, linkname=target), b""


def layer(*entries: tuple[tarfile.TarInfo, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in entries:
            tf.addfile(info, io.BytesIO(data) if data else None)
    return out.getvalue()


def build(root: Path, *layers: bytes) -> list[LayerStats]:
    root.mkdir(exist_ok=True)
    stats = []
    with RootBuilder(root) as builder:
        for blob in layers:
            stream = LayerStream(io.BytesIO(blob), "layer")
            stats.append(builder.apply(stream))
            stream.drain()
        builder.finish()
    return stats


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host directory next to the root that no layer may touch."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "victim").write_text("host file")
    return path


# -- ordinary layers


@fast
def test_files_directories_and_their_metadata_are_kept(tmp_path):
    root = tmp_path / "root"
    build(
        root,
        layer(
            D("./", mode=0o755),
            D("etc", mode=0o750, uid=0, gid=42),
            F("etc/conf", b"x=1\n", mode=0o640, uid=1234, gid=5678),
            F("bin/su", b"\x7fELF", mode=0o4755),
            D("ro", mode=0o555),
            F("ro/file", b"inside a 0555 directory"),
            S("bin/sh", "/bin/busybox"),
        ),
    )
    conf = (root / "etc/conf").lstat()
    assert (root / "etc/conf").read_bytes() == b"x=1\n"
    assert stat.S_IMODE(conf.st_mode) == 0o640 and conf.st_mtime == MTIME
    expected_owner = (1234, 5678) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    assert (conf.st_uid, conf.st_gid) == expected_owner
    assert stat.S_IMODE((root / "bin/su").stat().st_mode) == 0o4755  # setuid kept
    assert stat.S_IMODE((root / "etc").stat().st_mode) == 0o750
    assert stat.S_IMODE((root / "ro").stat().st_mode) == 0o555
    assert (root / "ro").stat().st_mtime == MTIME  # set after its file was written
    assert stat.S_IMODE((root / "bin").stat().st_mode) == 0o755  # made for bin/su
    assert os.readlink(root / "bin/sh") == "/bin/busybox"  # absolute targets as they are
    assert (root / "bin/sh").lstat().st_mtime == MTIME


@fast
def test_a_later_layer_replaces_files_links_and_directories(tmp_path):
    root = tmp_path / "root"
    build(
        root,
        layer(F("a", b"old"), D("b"), F("b/inner", b"1"), S("c", "a"), F("d", b"file")),
        layer(F("a", b"new"), F("b", b"now a file"), F("c", b"not a link"), D("d")),
    )
    assert (root / "a").read_bytes() == b"new"
    assert (root / "b").read_bytes() == b"now a file"
    assert not (root / "c").is_symlink() and (root / "c").read_bytes() == b"not a link"
    assert (root / "d").is_dir()


@fast
def test_whiteouts_remove_what_lower_layers_made(tmp_path):
    root = tmp_path / "root"
    stats = build(
        root,
        layer(F("keep"), F("gone"), D("dir"), F("dir/x"), D("dir/sub"), F("dir/sub/y")),
        layer(F(".wh.gone"), F(".wh.dir"), F(".wh.never-existed")),
    )
    assert sorted(os.listdir(root)) == ["keep"]
    assert stats[1].whiteouts == 3


@fast
def test_a_whiteout_does_not_hide_its_own_layers_file(tmp_path):
    root = tmp_path / "root"
    build(root, layer(F("x", b"lower")), layer(F("x", b"same layer"), F(".wh.x")))
    assert (root / "x").read_bytes() == b"same layer"


@fast
@pytest.mark.parametrize("marker_first", [True, False])
def test_an_opaque_directory_hides_lower_contents_only(tmp_path, marker_first):
    root = tmp_path / "root"
    lower = layer(D("d"), F("d/old"), D("d/olddir"), F("d/olddir/f"), D("d/kept"), F("d/kept/lo"))
    upper_entries = [D("d"), F("d/new", b"n"), D("d/kept"), F("d/kept/up", b"u")]
    marker = F("d/.wh..wh..opq")
    upper = layer(*([marker, *upper_entries] if marker_first else [*upper_entries, marker]))
    build(root, lower, upper)
    assert sorted(os.listdir(root / "d")) == ["kept", "new"]
    assert os.listdir(root / "d/kept") == ["up"]


@fast
def test_hard_links_share_the_inode_and_survive_a_replaced_target(tmp_path):
    root = tmp_path / "root"
    build(
        root,
        layer(F("bin/busybox", b"BB", mode=0o755), H("bin/ls", "bin/busybox"), H("cat", "/bin/ls")),
        layer(F("bin/busybox", b"new busybox")),
    )
    assert (root / "bin/ls").stat().st_ino == (root / "cat").stat().st_ino
    assert (root / "bin/ls").read_bytes() == b"BB"  # the upper layer made a new file
    assert (root / "bin/busybox").read_bytes() == b"new busybox"


@fast
def test_device_nodes_are_skipped_and_counted_fifos_are_made(tmp_path):
    root = tmp_path / "root"
    stats = build(
        root,
        layer(
            D("dev"),
            (_info("dev/null", tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666), b""),
            (_info("dev/sda", tarfile.BLKTYPE, devmajor=8, devminor=0, mode=0o660), b""),
            (_info("run/fifo", tarfile.FIFOTYPE, mode=0o620), b""),
        ),
    )
    assert stats[0].skipped_devices == 2
    assert os.listdir(root / "dev") == []
    fifo = (root / "run/fifo").lstat()
    assert stat.S_ISFIFO(fifo.st_mode) and stat.S_IMODE(fifo.st_mode) == 0o620


# -- hostile layers


@fast
@pytest.mark.parametrize("name", ["/etc/passwd", "../escape", "a/../../escape", "a/../b"])
def test_absolute_and_dotdot_names_are_refused(tmp_path, name):
    with pytest.raises(BadImage, match=r"absolute|'\.\.'"):
        build(tmp_path / "root", layer(F(name, b"x")))
    assert not (tmp_path / "escape").exists()


@fast
@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_a_symlink_cannot_carry_a_later_write_outside(tmp_path, outside, how):
    target = str(outside) if how == "absolute" else "../" * 12 + str(outside).lstrip("/")
    with pytest.raises(BadImage):
        build(tmp_path / "root", layer(S("evil", target)), layer(F("evil/pwned", b"x")))
    assert sorted(os.listdir(outside)) == ["victim"]
    # The same link in the same layer, or a deeper path through it: still nothing outside.
    with pytest.raises(BadImage):
        build(tmp_path / "root2", layer(S("evil", target), F("evil/a/b/pwned", b"x")))
    assert sorted(os.listdir(outside)) == ["victim"]


@fast
def test_a_symlink_resolves_inside_the_root_as_in_the_sandbox(tmp_path, outside):
    """A path through a link lands where the link points inside the root (Docker's rule)."""
    root = tmp_path / "root"
    build(
        root,
        layer(D("usr/lib"), S("lib", "/usr/lib"), S("up", "../../..")),
        layer(F("lib/libx.so", b"x"), F("up/top", b"t")),
    )
    assert (root / "usr/lib/libx.so").read_bytes() == b"x"
    assert (root / "top").read_bytes() == b"t"  # '..' stops at the root
    assert not (tmp_path / "top").exists()


@fast
def test_a_file_over_a_symlink_replaces_the_link_never_writes_through_it(tmp_path, outside):
    root = tmp_path / "root"
    build(root, layer(S("victim", str(outside / "victim"))), layer(F("victim", b"pwned")))
    assert (outside / "victim").read_text() == "host file"
    assert (root / "victim").read_bytes() == b"pwned" and not (root / "victim").is_symlink()
    build(tmp_path / "r2", layer(S("x", str(outside / "victim")), F("x", b"pwned")))
    assert (outside / "victim").read_text() == "host file"


@fast
def test_a_directory_over_a_symlink_replaces_the_link(tmp_path, outside):
    root = tmp_path / "root"
    build(root, layer(S("d", str(outside))), layer(D("d", mode=0o700), F("d/f", b"x")))
    assert (root / "d").is_dir() and not (root / "d").is_symlink()
    assert sorted(os.listdir(outside)) == ["victim"]
    assert (outside / "victim").read_text() == "host file"


@fast
def test_whiteouts_cannot_delete_through_a_symlink(tmp_path, outside):
    for marker in (".wh.victim", ".wh..wh..opq"):
        build(tmp_path / marker, layer(S("evil", str(outside))), layer(F(f"evil/{marker}")))
        assert sorted(os.listdir(outside)) == ["victim"], marker
    with pytest.raises(BadImage, match="whiteout"):
        build(tmp_path / "dots", layer(D("a")), layer(F("a/.wh..")))


@fast
def test_hard_links_cannot_reach_outside(tmp_path, outside):
    for target in ("../outside/victim", "a/../../outside/victim"):
        with pytest.raises(BadImage):
            build(tmp_path / "r1", layer(H("x", target)))
    # Through a symlink, or by an absolute name: resolved inside the root, where there is
    # no such file.
    with pytest.raises(BadImage, match=r"missing|No such"):
        build(tmp_path / "r2", layer(S("evil", str(outside)), H("x", "evil/victim")))
    with pytest.raises(BadImage):
        build(tmp_path / "r3", layer(H("x", str(outside / "victim"))))
    # Where the root has that file, the link is to the root's own.
    root = tmp_path / "r4"
    inner = str(outside / "victim").lstrip("/")
    build(root, layer(F(inner, b"inner"), S("evil", str(outside)), H("x", "evil/victim")))
    assert (root / "x").stat().st_ino == (root / inner).stat().st_ino
    assert (root / "x").stat().st_ino != (outside / "victim").stat().st_ino
    # A link to a link is a link to the symlink itself, never to what it points at.
    build(tmp_path / "r5", layer(S("s", str(outside / "victim")), H("h", "s")))
    assert (tmp_path / "r5/h").is_symlink()
    assert (outside / "victim").stat().st_nlink == 1


@fast
def test_a_hard_link_to_a_directory_is_refused(tmp_path):
    with pytest.raises(BadImage):
        build(tmp_path / "root", layer(D("d"), H("x", "d")))


# -- streams


@fast
def test_gzip_layers_and_their_diff_ids(tmp_path):
    plain = layer(F("a", b"A" * 100_000), F("b", os.urandom(300_000)))
    for blob in (gzip.compress(plain), gzip.compress(plain[:5000]) + gzip.compress(plain[5000:])):
        stream = LayerStream(io.BytesIO(blob), "layer")
        root = tmp_path / hashlib.sha256(blob).hexdigest()[:8]
        root.mkdir()
        with RootBuilder(root) as builder:
            builder.apply(stream)
            stream.drain()
            builder.finish()
        assert stream.diff_id() == "sha256:" + hashlib.sha256(plain).hexdigest()
        assert (root / "a").read_bytes() == b"A" * 100_000


@fast
@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (gzip.compress(layer(F("a", b"x" * 50_000)))[:-100], "truncated|corrupt"),
        (b"\x1f\x8b" + b"\x00" * 100, "gzip"),
        (b"\x28\xb5\x2f\xfd" + b"\x00" * 100, "zstd"),
        (b"this is not a tar archive at all" * 40, "tar"),
        (layer(F("a", b"x" * 50_000))[:1500], "tar"),
    ],
    ids=["truncated-gzip", "bad-gzip", "zstd", "not-tar", "truncated-tar"],
)
def test_broken_layers_are_bad_images(tmp_path, blob, message):
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(BadImage, match=message), RootBuilder(root) as builder:
        stream = LayerStream(io.BytesIO(blob), "layer")
        builder.apply(stream)
        stream.drain()


@fast
def test_an_empty_blob_is_an_empty_layer(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    with RootBuilder(root) as builder:
        assert builder.apply(LayerStream(io.BytesIO(b""), "layer")).entries == 0


# -- not root


def test_a_non_root_unpacker_gets_through_read_only_directories(tmp_path):
    """Run as nobody: a lower layer's 0555 directory still takes an upper layer's file, a
    whiteout still removes from it, and the store can remove the tree afterwards."""
    script = textwrap.dedent(
        f"""
        import io, os, sys
        sys.path[:0] = {[str(Path(__file__).parent)]!r}
        from pathlib import Path
        from test_image_layers import D, F, build, layer
        from orchard_env_server.images.files import Removed, remove_path
        root = Path(sys.argv[1]) / "root"
        build(root, layer(D("ro", mode=0o555), F("ro/a"), F("ro/b"), D("ro/sub", mode=0o500)),
              layer(F("ro/c", b"upper"), F("ro/.wh.a"), F("ro/sub/x", b"deep")))
        assert sorted(os.listdir(root / "ro")) == ["b", "c", "sub"], os.listdir(root / "ro")
        assert oct(os.stat(root / "ro").st_mode & 0o777) == "0o555"
        assert oct(os.stat(root / "ro/sub").st_mode & 0o777) == "0o500"
        removed = Removed()
        remove_path(root, removed)
        assert not root.exists() and removed.files == 3, removed.files
        print("ok")
        """
    )
    work = Path(tempfile.mkdtemp(prefix="orchard-nonroot-"))  # pytest's tmp is root's 0700
    try:
        argv = [sys.executable, "-c", script, str(work)]
        if os.geteuid() == 0:
            os.chown(work, 65534, 65534)
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr

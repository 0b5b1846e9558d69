"""A sandbox's writable root over a shared image tree (``backends/local/image_roots.py``), made
for real: id-mapped overlay mounts as root, and the copy that serves where they can't."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchard_env_server.backends.local.image_roots import LOWER, ROOT, UPPER, ImageRoots

FIRST_UID = 3_000_000_000  # far above any range the uid registry hands out

pytestmark = pytest.mark.integration  # mounts for real: run as root (as CI does)


def _mounted(path: Path) -> bool:
    """Whether a mount sits on ``path`` (``os.path.ismount`` misses same-device binds)."""
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return str(path) in points


def _image(where: Path) -> Path:
    (where / "usr" / "bin").mkdir(parents=True)
    (where / "etc").mkdir()
    (where / "usr" / "bin" / "tool").write_text("v1")
    (where / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    os.chown(where / "etc" / "passwd", 0, 42)
    (where / "usr" / "bin" / "su").write_text("")
    os.chmod(where / "usr" / "bin" / "su", 0o4755)
    return where


@pytest.mark.parametrize("mode", ["overlay", "copy"])
def test_a_root_is_the_images_tree_owned_by_the_sandbox_and_its_writes_are_its_own(
    tmp_path: Path, mode: str
):
    image = _image(tmp_path / "image")
    roots = ImageRoots()
    roots.probe(tmp_path)
    assert roots.mode == "overlay", roots.why_copy  # as root on a kernel with id-mapped mounts
    roots.mode = mode  # type: ignore[assignment]
    home = tmp_path / "home"
    home.mkdir()
    root = roots.make(home, image, FIRST_UID)
    try:
        passwd = os.stat(root / "etc" / "passwd")
        assert (passwd.st_uid, passwd.st_gid) == (FIRST_UID, FIRST_UID + 42)
        assert os.stat(root / "usr" / "bin" / "su").st_mode & 0o7777 == 0o4755
        (root / "usr" / "bin" / "tool").write_text("v2")
        (root / "etc" / "passwd").unlink()
        (root / "new").mkdir()
        assert (image / "usr" / "bin" / "tool").read_text() == "v1"
        assert (image / "etc" / "passwd").is_file()
        assert not (image / "new").exists()
        if mode == "overlay":
            assert _mounted(root) and _mounted(home / LOWER)
            assert (home / UPPER / "usr" / "bin" / "tool").read_text() == "v2"
            with pytest.raises(OSError):  # the shared tree is read-only through the bind
                (home / LOWER / "usr" / "bin" / "tool").write_text("v3")
    finally:
        roots.remove(home)
    assert not _mounted(home / ROOT) and not _mounted(home / LOWER)
    assert (image / "usr" / "bin" / "tool").read_text() == "v1"


def test_removing_an_unmounted_or_missing_home_is_harmless(tmp_path: Path):
    roots = ImageRoots()
    roots.remove(tmp_path / "never-made")
    roots.remove(tmp_path)

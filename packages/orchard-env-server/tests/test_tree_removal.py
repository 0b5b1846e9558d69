"""Removing trees (``images.files``): deep ones, unwritable ones, links never followed."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
from pathlib import Path

import pytest

from orchard_env_server.images.files import Removed, remove_path, remove_tree


def _deep(top: Path, depth: int) -> None:
    """``top/d/d/…`` ``depth`` levels down, a file at the bottom (made by fds: the path
    itself is longer than PATH_MAX)."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        os.close(os.open("bottom", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)


def test_a_tree_deeper_than_the_recursion_limit_is_removed(tmp_path: Path):
    _deep(tmp_path / "top", 5000)
    removed = Removed()
    remove_path(tmp_path / "top", removed)
    assert not (tmp_path / "top").exists() and removed.files == 1


def test_links_are_removed_not_followed(tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("kept")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "link").symlink_to(outside)
    (tree / "file").write_text("x")
    (tree / "sub").chmod(0o500)  # unwritable, as a layer may leave it
    remove_tree(tree)
    assert not tree.exists() and (outside / "kept").read_text() == "kept"
    remove_tree(tree)  # already gone: nothing to do


def test_a_tree_deeper_than_the_open_file_limit_is_removed(tmp_path: Path):
    _deep(tmp_path / "top", 3000)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        remove_path(tmp_path / "top", Removed())
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not (tmp_path / "top").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_a_mount_inside_the_tree_is_left_with_what_holds_it(tmp_path: Path):
    """A bind mount (same file system: ``st_dev`` cannot tell) is never entered: its
    content survives, the rest of the tree goes, and the caller learns of it."""
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep").write_text("kept")
    tree = tmp_path / "tree"
    (tree / "a" / "mnt").mkdir(parents=True)
    (tree / "a" / "file").write_text("x")
    (tree / "b").mkdir()
    subprocess.run(["mount", "--bind", str(precious), str(tree / "a" / "mnt")], check=True)
    try:
        with pytest.raises(OSError) as info:
            remove_path(tree, Removed())
        assert info.value.errno == errno.EBUSY
        assert (precious / "keep").read_text() == "kept"
        assert not (tree / "b").exists() and not (tree / "a" / "file").exists()
    finally:
        subprocess.run(["umount", str(tree / "a" / "mnt")], check=True)
    remove_path(tree, Removed())
    assert not tree.exists() and (precious / "keep").is_file()

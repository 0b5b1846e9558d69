"""Which image a harness's sandboxes use on each backend."""

from __future__ import annotations

import os

from .foreign import HARNESS_IMAGE, HARNESS_ROOTFS

__all__ = ["default_image", "harnesses_rootfs", "serve_args"]

ROOTFS_ENV = "ORCHARD_HARNESSES_ROOTFS"


def harnesses_rootfs() -> str:
    """The harnesses image as a root filesystem directory for the local backend
    (``$ORCHARD_HARNESSES_ROOTFS``, else where ``infra/images/build`` puts it)."""
    return os.environ.get(ROOTFS_ENV) or HARNESS_ROOTFS


def serve_args(backend: str) -> list[str]:
    """What a local service started for the harnesses needs: leave to run their root
    filesystem directory (a server names no such directory unless its operator says so)."""
    parent = os.path.dirname(os.path.abspath(harnesses_rootfs()))
    if backend != "local" or not os.path.isdir(parent):
        return []
    return ["--local-rootfs-dir", parent]


def default_image(backend: str | None, harness: str) -> str:
    """The harnesses image on Docker and Kubernetes; on the local backend its root
    filesystem directory (every harness runs on the same tree, ours included, so a
    comparison differs in the harness alone)."""
    del harness  # one image holds them all; kept so a harness could ask for its own
    if backend == "local":
        root = harnesses_rootfs()
        if not os.path.isdir(root):
            raise FileNotFoundError(
                f"the harnesses root filesystem {root} is missing: build it with "
                "`infra/images/build --only harnesses` (or set ORCHARD_HARNESSES_ROOTFS)"
            )
        return root
    return HARNESS_IMAGE

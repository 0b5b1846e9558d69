"""Fixtures of the image store's tests: ``docker save`` archives of the test images, a
multi-layer image built with whiteouts and an opaque directory, and a real local registry
(tests/images/registry.py)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from images.registry import LocalRegistry

from orchard_testing import BUSYBOX_IMAGE, IMAGES, docker, require_backend

DEBIAN_IMAGE = IMAGES["docker"]

# Two layers over busybox: a file and a directory removed (whiteouts), a directory
# replaced (an opaque directory), hard links, a setuid file of another owner, a FIFO and
# a symlink with an absolute target.
LAYERED_DOCKERFILE = f"""\
FROM {BUSYBOX_IMAGE}
RUN mkdir -p /d/sub /w && echo lower > /d/sub/f && echo keep > /d/keep && echo gone > /gone \\
 && echo x > /w/x && echo y > /w/y && echo hl > /hl1 && ln /hl1 /hl2 && mkdir -p /gone-dir/a
RUN rm -r /gone /gone-dir /w/x && rm -rf /d && mkdir /d && echo upper > /d/new \\
 && chown 1234:5678 /d/new && chmod 4755 /d/new && ln -s /etc/passwd /abs-link \\
 && mkfifo /fifo && ln /hl1 /hl3 && chmod 0555 /w
"""


@pytest.fixture(scope="session")
def docker_engine() -> None:
    require_backend("docker")


@pytest.fixture(scope="session")
def saved_image(
    docker_engine: None, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    """``docker save`` of a local image (made once per session)."""
    archives: dict[str, Path] = {}
    workdir = tmp_path_factory.mktemp("saved")

    def save(image: str) -> Path:
        if image not in archives:
            target = workdir / f"{len(archives)}.tar"
            docker("save", "-o", str(target), image)
            archives[image] = target
        return archives[image]

    return save


@pytest.fixture(scope="session")
def layered_image(docker_engine: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A three-layer image built with ``docker build`` (removed at the end)."""
    context = tmp_path_factory.mktemp("layered")
    (context / "Dockerfile").write_text(LAYERED_DOCKERFILE)
    name = f"orchard-test/layered-{secrets.token_hex(4)}:latest"
    docker("build", "-q", "-t", name, str(context))
    yield name
    docker("rmi", "-f", name, check=False)


@pytest.fixture(scope="session")
def local_registry(
    docker_engine: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalRegistry]:
    """A real registry (Debian's docker-registry) on 127.0.0.1, empty at first."""
    registry = LocalRegistry(tmp_path_factory.mktemp("registry"))
    yield registry
    registry.stop()


@pytest.fixture(scope="session")
def pushed(local_registry: LocalRegistry) -> Callable[[str, str], str]:
    """Push a local image to the registry under a repo:tag (once): its manifest digest."""
    done: dict[tuple[str, str], str] = {}

    def push(image: str, repo_tag: str) -> str:
        if (image, repo_tag) not in done:
            done[image, repo_tag] = local_registry.push(image, repo_tag)
        return done[image, repo_tag]

    return push

"""Fixtures of the escape suite: the images probed, a client of the shared orchestrator,
sandboxes to probe from, and secrets planted on the host. Registers the ``security``
marker that every module here carries (``uv run pytest -m security``)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest
from security.probing import HostSecret, planted_secrets

from orchard_env_client import Sandbox, SandboxClient
from orchard_testing import IMAGES, RunningServer, import_into_test_store, require_backend


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "security: the escape suite of tests/security (every backend, host-safe)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Root filesystem and image-store images are the local backend's alone: other
    backends' items for them are dropped (deselected, not skipped)."""
    dropped = [
        item
        for item in items
        if _params(item).get("image") in ("rootfs", "stored")
        and _params(item).get("backend") != "local"
    ]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]


def _params(item: pytest.Item) -> dict[str, object]:
    callspec = getattr(item, "callspec", None)
    return dict(callspec.params) if callspec else {}


@pytest.fixture(scope="session", params=["image", "rootfs", "stored"])
def image(
    request: pytest.FixtureRequest, backend: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The backend's test image; on the local backend also a root filesystem directory
    (the Debian test image's, exported from the Docker engine) and the same image
    imported into the test servers' shared image store, as well as the host's."""
    if request.param == "image":
        yield IMAGES[backend]
        return
    require_backend("docker")
    if request.param == "stored":
        import_into_test_store(IMAGES["docker"])
        yield IMAGES["docker"]
        return
    root = tmp_path_factory.mktemp("rootfs")
    container = subprocess.run(
        ["docker", "create", IMAGES["docker"]],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.strip()
    try:
        export = subprocess.Popen(["docker", "export", container], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(root)], stdin=export.stdout, check=True, timeout=600)
        assert export.wait(timeout=60) == 0
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, timeout=120)
    yield str(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[SandboxClient]:
    with SandboxClient(base_url=server.url) as c:
        yield c


@pytest.fixture(scope="module")
def blocked_sandbox(client: SandboxClient, image: str) -> Sandbox:
    """A sandbox with the default, blocked network, shared by a module's probes."""
    return client.create_sandbox(image, block_network=True)


@pytest.fixture(scope="module")
def open_sandbox(client: SandboxClient, image: str) -> Sandbox:
    """A sandbox allowed to reach the network, shared by a module's probes."""
    return client.create_sandbox(image, block_network=False)


@pytest.fixture(scope="module")
def host_secrets(server: RunningServer) -> Iterator[list[HostSecret]]:
    """Private files planted under /root, /srv, /var/tmp, /home, the temp dir and the
    orchestrator's state dir; each has a unique name and content and is removed after."""
    with planted_secrets(server.state_dir) as secrets:
        assert len(secrets) >= 4, secrets
        yield secrets

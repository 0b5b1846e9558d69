"""Fixtures of the escape suite: a client of the shared orchestrator, sandboxes to probe
from, and secrets planted on the host. Every test here carries the ``security`` marker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from security.probing import HostSecret, planted_secrets

from orchard_env_client import Sandbox, SandboxClient
from orchard_testing import RunningServer


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "security: the escape suite of tests/security (every backend, host-safe)"
    )


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

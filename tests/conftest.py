"""Fixtures that start the real orchestrator (and through it, real agent processes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard_env_client import Sandbox, SandboxClient
from orchard_testing import IMAGES, RunningServer, require_backend, selected_backends

# Every integration test runs once per backend. ORCHARD_TEST_BACKENDS narrows the set for
# quick iteration (e.g. "local"); CI runs all of them.
BACKENDS = selected_backends()


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name = str(request.param)
    require_backend(name)
    return name


@pytest.fixture(scope="session")
def image(backend: str) -> str:
    """The image a test's sandboxes use: the host itself locally, a Debian image on Docker."""
    return IMAGES[backend]


@pytest.fixture(scope="session")
def server(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A shared orchestrator for tests that only add and remove their own sandboxes."""
    srv = RunningServer(backend=backend, state_dir=tmp_path_factory.mktemp("state") / "s")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def sandbox(server: RunningServer, image: str) -> Iterator[Sandbox]:
    """One sandbox on the shared server for a module's tests (a module may define its own)."""
    with SandboxClient(base_url=server.url) as client:
        sbx = client.create_sandbox(image)
        yield sbx
        sbx.delete()


@pytest.fixture
def fresh_server(backend: str, tmp_path: Path) -> Iterator[RunningServer]:
    """An orchestrator of the test's own, for tests that restart, kill or configure it."""
    srv = RunningServer(backend=backend, state_dir=tmp_path / "state")
    yield srv
    srv.stop()

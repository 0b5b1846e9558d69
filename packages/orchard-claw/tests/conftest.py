"""Real Orchard Env services for the claw recipe's tests, per backend.

Tasks run on the local backend (image ``host``: the host's bash and python3) and on Docker
(``orchard-test/debian``, which has python3). Kubernetes runs the Docker image through the
same code path and is not repeated here.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs
import pytest

from orchard_env_client import SandboxClient
from orchard_testing import RunningServer, require_backend, selected_backends

CLAW_BACKENDS = [b for b in selected_backends() if b in ("local", "docker")]


@pytest.fixture(scope="session", params=CLAW_BACKENDS)
def claw_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """One orchestrator per backend for the session."""
    require_backend(request.param)
    srv = RunningServer(
        backend=request.param, state_dir=tmp_path_factory.mktemp("claw-state") / "s"
    )
    srv.start()
    yield srv
    srv.stop()


@attrs.define(frozen=True)
class SharedSandbox:
    """A sandbox kept for the session (tasks reset ``/workspace`` between them)."""

    url: str
    sandbox_id: str
    backend: str


@pytest.fixture(scope="session")
def claw_sandbox(claw_server: RunningServer) -> Iterator[SharedSandbox]:
    """One network-less sandbox per backend, shared by the task tests (async tests bind an
    ``AsyncSandboxClient`` to it by id in their own event loop)."""
    with SandboxClient(claw_server.url) as client:
        sandbox = client.create_sandbox(claw_server.image, timeout=120)
        try:
            yield SharedSandbox(claw_server.url, sandbox.sandbox_id, claw_server.backend)
        finally:
            sandbox.delete()


@pytest.fixture(scope="session")
def claw_local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One local-backend service, for tests whose subject is the recipe, not the backend."""
    srv = RunningServer(backend="local", state_dir=tmp_path_factory.mktemp("claw-local") / "s")
    srv.start()
    yield srv
    srv.stop()

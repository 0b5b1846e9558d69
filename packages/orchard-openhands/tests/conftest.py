"""Fixtures of the OpenHands harness tests: a real Orchard service per selected backend,
a scripted model server, and the Python 3.12 venv the harness runs in."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from py312_venv import Py312Error, adapter_backends, adapter_venv

from orchard_env_client.testing import ScriptedModelServer
from orchard_testing import RunningServer, require_backend


@pytest.fixture(scope="session")
def openhands_venv() -> Path:
    """The cached 3.12 venv with the harness installed; built on first use (seconds with
    a warm uv cache, minutes without)."""
    try:
        return adapter_venv("openhands")
    except Py312Error as exc:
        pytest.fail(f"cannot build the OpenHands venv: {exc}")


# Local and Docker: Kubernetes passes too (docs) but a run there costs a minute more of
# CI, where the whole suite has a 90-minute budget; ORCHARD_ADAPTER_BACKENDS widens it.
@pytest.fixture(scope="session", params=adapter_backends())
def backend(request: pytest.FixtureRequest) -> str:
    name = str(request.param)
    require_backend(name)
    return name


@contextlib.contextmanager
def _serving(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = RunningServer(backend=backend, state_dir=tmp_path_factory.mktemp("oh-state") / "s")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def server(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with _serving(backend, tmp_path_factory) as srv:
        yield srv


@pytest.fixture(scope="session")
def runner_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server on the first adapter backend, for tests of the runner's own logic
    (errors, limits, cancellation), which no backend changes."""
    name = adapter_backends()[0]
    require_backend(name)
    with _serving(name, tmp_path_factory) as srv:
        yield srv


@pytest.fixture(scope="session")
def model_server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as srv:
        yield srv

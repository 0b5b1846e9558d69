"""A real Orchard Env service for the GUI recipe's end-to-end tests, per browser backend.

The recipe runs on the local backend (image ``host``: the host's Chromium, Playwright shipped
into the sandbox) and on Docker (``orchard-test/browser``). Kubernetes runs the same image
and code path as Docker and is not repeated here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchard_testing import RunningServer, require_backend, selected_backends

GUI_BACKENDS = [b for b in selected_backends() if b in ("local", "docker")]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "on_backends(*names): run only on these backends (others are deselected)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Items marked ``on_backends`` whose service runs another backend are deselected, not
    skipped: a test of what only Docker can show has nothing to say on the local backend."""
    dropped = []
    for item in items:
        marker = item.get_closest_marker("on_backends")
        callspec = getattr(item, "callspec", None)
        params = dict(callspec.params) if callspec else {}
        backend = params.get("service", params.get("gui_server"))
        if marker and backend is not None and backend not in marker.args:
            dropped.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]


@pytest.fixture(scope="session", params=GUI_BACKENDS)
def gui_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    require_backend(request.param)
    srv = RunningServer(backend=request.param, state_dir=tmp_path_factory.mktemp("gui-state") / "s")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def gui_local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One local-backend service, for tests whose subject is the harness, not the backend."""
    srv = RunningServer(backend="local", state_dir=tmp_path_factory.mktemp("gui-local") / "s")
    srv.start()
    yield srv
    srv.stop()

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


@pytest.fixture(scope="session", params=GUI_BACKENDS)
def gui_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    require_backend(request.param)
    srv = RunningServer(backend=request.param,
                        state_dir=tmp_path_factory.mktemp("gui-state") / "s")  # fmt: skip
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

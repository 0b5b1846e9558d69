"""A real Orchard Env service for the recipe's tests: each selected backend in turn.

On Docker the repository tasks run in ``orchard-test/debian`` (git, python3, pytest).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchard_testing import RunningServer, require_backend, selected_backends


@pytest.fixture(scope="session", params=selected_backends())
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    require_backend(request.param)
    srv = RunningServer(backend=request.param,
                        state_dir=tmp_path_factory.mktemp("swe-state") / "s")  # fmt: skip
    srv.start()
    yield srv
    srv.stop()

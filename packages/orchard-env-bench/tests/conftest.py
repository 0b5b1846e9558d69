"""Fixtures of the bench tests: the backend each bench runs on (the benches start their own
server, so no server fixture)."""

from __future__ import annotations

import pytest

from orchard_testing import require_backend, selected_backends


@pytest.fixture(scope="session", params=selected_backends())
def backend(request: pytest.FixtureRequest) -> str:
    """A backend that is selected (``ORCHARD_TEST_BACKENDS``) and up; skips otherwise."""
    name = str(request.param)
    require_backend(name)
    return name

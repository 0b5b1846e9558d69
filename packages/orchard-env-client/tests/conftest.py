"""Fixtures of the client's unit tests: a fake server and no real backoff sleeps."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from client_fakes import FakeServer

from orchard_env_client import _http


@pytest.fixture
def fake() -> FakeServer:
    return FakeServer()


@pytest.fixture(autouse=True)
def no_backoff_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record backoff delays instead of sleeping them."""
    delays: list[float] = []

    async def record(seconds: float) -> None:
        delays.append(seconds)

    monkeypatch.setattr(_http, "_sleep", record)
    return delays


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCHARD_ENV_URL", raising=False)
    monkeypatch.delenv("ORCHARD_ENV_API_KEY", raising=False)

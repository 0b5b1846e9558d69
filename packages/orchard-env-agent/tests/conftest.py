"""Fixtures that start the real agent as a subprocess (single and multi mode)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agent_harness import Agent, boxed_sandbox, start_agent, stop_agent


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    agent = start_agent(
        tmp_path_factory.mktemp("single"),
        multi=False,
        extra=["--max-output-bytes", "4096", "--max-upload-bytes", str(30 << 20)],
    )
    yield agent
    stop_agent(agent)


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    agent = start_agent(tmp_path_factory.mktemp("multi"), multi=True)
    yield agent
    stop_agent(agent)


@pytest.fixture
def boxed(multi: Agent, tmp_path: Path) -> Iterator[Agent]:
    """A real bubblewrap holder registered with the module's multi-sandbox agent."""
    with boxed_sandbox(multi, tmp_path) as agent:
        yield agent

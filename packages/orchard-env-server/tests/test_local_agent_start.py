"""Starting the local backend's shared agent (a real agent process): a start that does not
finish leaves no agent behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil
import pytest

from orchard_env_server.backends.local.agent import LocalAgent


def _agents_of(state_dir: Path) -> list[int]:
    """Pids of live agent processes started for ``state_dir`` (by their --port-file)."""
    marker = str(state_dir / "agent.port")
    return [
        proc.pid
        for proc in psutil.process_iter(["cmdline", "status"])
        if marker in (proc.info["cmdline"] or []) and proc.info["status"] != psutil.STATUS_ZOMBIE
    ]


async def test_a_start_cancelled_before_the_agent_listens_leaves_no_agent(tmp_path: Path) -> None:
    # A shutdown that lands while a dead agent is being replaced cancels the start.
    agent = LocalAgent(tmp_path, 1 << 20, 1 << 20)
    starting = asyncio.create_task(agent.ensure())
    for _ in range(1000):
        if _agents_of(tmp_path):
            break
        await asyncio.sleep(0.001)
    assert _agents_of(tmp_path), "the agent process was not started"
    assert not (tmp_path / "agent.port").exists(), "the agent listened too soon for this test"
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert _agents_of(tmp_path) == [], "a cancelled start left its agent running"
    assert agent.pid is None

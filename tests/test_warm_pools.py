"""Warm pools (``--warm-pool IMAGE=SIZE``): a create that fits takes a sandbox made ahead;
one is never given to a second tenant nor reused; the pool refills, empties when idle and
leaves nothing behind. Local backend (the only one with pools)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchard_env_client import SandboxClient
from orchard_env_client.errors import SandboxNotFound
from orchard_testing import RunningServer, leftovers, only_backend

pytestmark = [pytest.mark.integration, only_backend("local")]


def _until(what: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _pool(client: SandboxClient) -> dict[str, int]:
    return client.resources()["warm_pools"]["host"]


@pytest.fixture
def pooled(backend: str, tmp_path: Path):
    server = RunningServer(backend=backend, state_dir=tmp_path / "state", api_keys="a:ka,b:kb")
    server.start("--warm-pool", "host=2", "--warm-pool-idle-ttl", "4")
    yield server
    server.stop()


def test_pooled_sandboxes_go_to_one_tenant_once_and_fresh(pooled):
    with (
        SandboxClient(base_url=pooled.url, api_key="ka") as alice,
        SandboxClient(base_url=pooled.url, api_key="kb") as bob,
    ):
        _until(lambda: _pool(alice)["ready"] == 2)
        first = alice.create_sandbox("host", labels={"who": "alice"})
        assert first.info.status == "ready" and first.info.labels == {"who": "alice"}
        first.exec("echo secret > /workspace/note")
        second = bob.create_sandbox("host")
        assert second.sandbox_id != first.sandbox_id
        with pytest.raises(SandboxNotFound):
            bob.get_sandbox(first.sandbox_id)
        assert [s.sandbox_id for s in bob.list_sandboxes()] == [second.sandbox_id]
        given = {first.sandbox_id, second.sandbox_id}
        first.delete()
        _until(lambda: _pool(alice)["ready"] == 2)  # refilled with new sandboxes
        third = bob.create_sandbox("host")
        assert third.sandbox_id not in given
        assert third.exec("ls -A /workspace").stdout == ""
        # A request a pooled sandbox does not fit is created as usual.
        custom = alice.create_sandbox("host", env={"X": "1"})
        assert custom.exec("echo $X").stdout == "1\n"


def test_an_idle_pool_empties_and_fills_again_on_demand(pooled):
    with SandboxClient(base_url=pooled.url, api_key="ka") as client:
        _until(lambda: _pool(client)["ready"] == 2)
        _until(lambda: _pool(client)["ready"] == 0, seconds=30)  # idle for 4 s
        client.create_sandbox("host").exec("true")  # made as usual, wakes the pool
        _until(lambda: _pool(client)["ready"] == 2)


def test_pooled_sandboxes_of_a_killed_server_are_removed_on_restart(pooled):
    with SandboxClient(base_url=pooled.url, api_key="ka", auto_cleanup=False) as client:
        _until(lambda: _pool(client)["ready"] == 2)
        kept = client.create_sandbox("host")
    pooled.kill()
    pooled.start("--warm-pool", "host=1")
    with SandboxClient(base_url=pooled.url, api_key="ka") as client:
        assert [s.sandbox_id for s in client.list_sandboxes()] == [kept.sandbox_id]
        _until(lambda: _pool(client)["ready"] == 1)
        sandboxes = pooled.state_dir / "sandboxes"
        _until(lambda: len(list(sandboxes.iterdir())) == 2)  # kept + one pooled
    pooled.stop()
    assert leftovers(pooled) == []

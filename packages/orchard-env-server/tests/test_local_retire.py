"""The local backend's delete in two halves: ``retire`` (the client's answer waits for it)
stops the sandbox and leaves a tombstone; ``reap`` removes the rest. An orchestrator that
dies between the two finishes the removal when it starts again and never adopts the
sandbox. Real bubblewrap sandboxes and a real shared agent."""

from __future__ import annotations

import asyncio
import os
import resource
from pathlib import Path

import pytest

from orchard_env_server.backends.local.backend import TOMBSTONE, LocalBackend
from orchard_env_server.backends.local.processes import start_time
from orchard_env_server.records import SandboxRecord
from orchard_env_server.schemas import CreateSandboxRequest
from orchard_env_server.settings import Settings

pytestmark = pytest.mark.integration


def _record(sandbox_id: str) -> SandboxRecord:
    return SandboxRecord.from_request(sandbox_id, "t", CreateSandboxRequest(image="host"))


async def _started(state: Path) -> tuple[LocalBackend, list[SandboxRecord]]:
    backend = LocalBackend(Settings(state_dir=state))
    found = await backend.start()
    if not backend.isolated:
        await backend.close(delete_sandboxes=True)
        pytest.skip(f"no bubblewrap isolation here: {backend.info().warnings}")
    return backend, found


async def _wait_gone(pid: int, timeout: float = 5.0) -> bool:
    for _ in range(int(timeout / 0.02)):
        if start_time(pid) is None:
            return True
        await asyncio.sleep(0.02)
    return False


async def test_retire_stops_the_sandbox_and_a_restart_finishes_its_removal(tmp_path):
    state = tmp_path / "state"
    backend, _ = await _started(state)
    kept, doomed = _record("sbx-kept"), _record("sbx-doomed")
    for record in (kept, doomed):
        await backend.create(record)
    home = state / "sandboxes" / doomed.sandbox_id
    holder = doomed.backend_state["holder_pid"]
    await backend.retire(doomed)
    assert (home / TOMBSTONE).exists()
    assert await _wait_gone(holder), "the sandbox's processes outlived its retirement"
    # The orchestrator "dies" here: nothing reaps the retired sandbox.
    await backend.close(delete_sandboxes=False)

    again, found = await _started(state)
    try:
        assert [r.sandbox_id for r in found] == [kept.sandbox_id]
        assert not home.exists()
        assert (state / "sandboxes" / kept.sandbox_id).exists()
    finally:
        await again.close(delete_sandboxes=True)
    assert not (state / "sandboxes" / kept.sandbox_id).exists()


async def test_delete_is_retire_then_reap(tmp_path):
    state = tmp_path / "state"
    backend, _ = await _started(state)
    try:
        record = _record("sbx-one")
        await backend.create(record)
        await backend.delete(record)
        assert not (state / "sandboxes" / record.sandbox_id).exists()
        assert start_time(record.backend_state["holder_pid"]) is None
        await backend.delete(record)  # idempotent
    finally:
        await backend.close(delete_sandboxes=True)


async def test_a_busy_server_past_fd_setsize_still_makes_sandboxes(tmp_path):
    """A thousand sandboxes keep a thousand and more fds open: a holder's setup must not
    wait with select(), which refuses fds past 1023."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the fd limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    backend, _ = await _started(tmp_path / "state")
    try:
        record = _record("sbx-many-fds")
        await backend.create(record)
        assert start_time(record.backend_state["holder_pid"]) is not None
    finally:
        await backend.close(delete_sandboxes=True)
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_restart_kills_the_holder_of_a_sandbox_whose_record_was_never_written(tmp_path):
    """A server killed between starting a holder and saving the record leaves a directory
    without a record: the restart finds the holder by its hostname and kills it."""
    state = tmp_path / "state"
    backend, _ = await _started(state)
    record = _record("sbx-half-made")
    await backend.create(record)
    holder = record.backend_state["holder_pid"]
    home = state / "sandboxes" / record.sandbox_id
    (home / "record.json").unlink()  # as if the server died just before saving it
    await backend.close(delete_sandboxes=False)
    assert start_time(holder) is not None

    again, found = await _started(state)
    try:
        assert found == []
        assert await _wait_gone(holder), "the unrecorded sandbox's holder was left running"
        assert not home.exists()
    finally:
        await again.close(delete_sandboxes=True)

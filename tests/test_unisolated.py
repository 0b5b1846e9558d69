"""Without bubblewrap the local backend still works, unisolated, and says so."""

from __future__ import annotations

import httpx
import pytest

from orchard_env_client import SandboxClient
from orchard_testing import only_backend

pytestmark = [pytest.mark.integration, only_backend("local")]


@pytest.fixture
def unisolated(fresh_server):
    fresh_server.start("--isolation", "none")
    return fresh_server


def test_health_and_the_log_warn_that_sandboxes_are_not_isolated(unisolated):
    health = httpx.get(unisolated.url + "/health").json()
    assert health["isolation"] == "none"
    assert any("not isolated" in w for w in health["warnings"])
    assert "UNISOLATED" in unisolated.log()


def test_commands_and_files_work_in_the_private_workspace(unisolated):
    with SandboxClient(base_url=unisolated.url) as client:
        a, b = client.create_sandbox("host"), client.create_sandbox("host")
        a.upload_content("/workspace/note.txt", "unisolated")
        assert a.exec("cat note.txt; echo $HOME").stdout.startswith("unisolated")
        assert a.exec("pwd").stdout.strip().endswith(f"{a.sandbox_id}/workspace")
        assert b.exec("cat note.txt").exit_code != 0
        job = a.exec("sleep 30", timeout=0.5)
        assert job.timed_out

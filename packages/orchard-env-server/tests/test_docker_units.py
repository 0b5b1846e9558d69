"""Pure logic of the Docker backend: quantities, the container spec, the log demultiplexer.

Whether the backend works is proven against a real engine in tests/test_docker.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchard_env_server.backends.base import BackendError
from orchard_env_server.backends.docker_api import _demultiplex
from orchard_env_server.backends.docker_injection import AgentMount, agent_entry
from orchard_env_server.backends.docker_spec import container_spec
from orchard_env_server.quantities import parse_cpu, parse_memory
from orchard_env_server.records import SandboxRecord
from orchard_env_server.settings import Settings

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("text", "cores"), [("2", 2.0), ("0.5", 0.5), ("500m", 0.5), ("1500m", 1.5)]
)
def test_cpu_quantities(text, cores):
    assert parse_cpu(text) == cores


@pytest.mark.parametrize(
    ("text", "size"),
    [("512Mi", 512 << 20), ("1Gi", 1 << 30), ("1G", 10**9), ("64k", 64 << 10),
     ("512m", 512 << 20), ("1.5Gi", 3 << 29), ("1000", 1000)],
)  # fmt: skip
def test_memory_quantities(text, size):
    assert parse_memory(text) == size


@pytest.mark.parametrize("text", ["lots", "", "1X", "-5Mi", "Mi"])
def test_bad_memory_quantities_are_errors(text):
    with pytest.raises(ValueError):
        parse_memory(text)


def test_zero_cpu_is_an_error():
    with pytest.raises(ValueError):
        parse_cpu("0m")


def _spec(**fields):
    record = SandboxRecord(sandbox_id="sbx-1", tenant="alice", image="img:1", **fields)
    return container_spec(record, Settings(), "orch-x", AgentMount("volume", "vol"), "/run/x")


def test_the_spec_replaces_the_entrypoint_with_the_agent_and_keeps_the_image_config():
    spec = _spec(env={"A": "1"})
    assert spec["Entrypoint"] == agent_entry()
    assert spec["Cmd"][:4] == [
        "--uds", "/.orchard/run/agent.sock", "--token-file", "/.orchard/run/token",
    ]  # fmt: skip
    assert "WorkingDir" not in spec and "User" not in spec  # the image's own stay in force
    assert spec["Env"] == ["ORCHARD_SANDBOX_ID=sbx-1", "A=1"]  # no token, no token file
    assert spec["Labels"] == {
        "org.orchard.sandbox-id": "sbx-1",
        "org.orchard.tenant": "alice",
        "org.orchard.orchestrator": "orch-x",
    }
    mounts = {m["Target"]: m for m in spec["HostConfig"]["Mounts"]}
    assert mounts["/.orchard/agent"]["ReadOnly"] and mounts["/.orchard/agent"]["Source"] == "vol"
    assert mounts["/.orchard/run"]["Source"] == "/run/x"


def test_blocked_network_means_no_network_and_limits_become_engine_limits():
    host = _spec(cpu="250m", memory="256Mi", block_network=True)["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["NanoCpus"] == 250_000_000
    assert host["Memory"] == host["MemorySwap"] == 256 << 20
    assert host["PidsLimit"] == Settings().pids_limit
    assert _spec(block_network=False)["HostConfig"]["NetworkMode"] == "bridge"


def test_too_little_memory_for_the_agent_is_refused():
    with pytest.raises(BackendError, match="below"):
        _spec(memory="8Mi")


@given(st.lists(st.tuples(st.sampled_from([1, 2]), st.binary(max_size=300)), max_size=8))
def test_log_frames_are_demultiplexed(frames):
    raw = b"".join(bytes([kind, 0, 0, 0]) + len(p).to_bytes(4, "big") + p for kind, p in frames)
    assert _demultiplex(raw) == b"".join(p for _, p in frames)

"""Pure logic of the Docker backend: quantities, the container spec and its confinement,
the log demultiplexer, connecting to an agent socket without following a symlink.

Whether the backend works is proven against a real engine in tests/test_docker.py.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchard_env_server.backends.base import BackendError
from orchard_env_server.backends.docker.api import _demultiplex
from orchard_env_server.backends.docker.injection import AgentMount, agent_entry
from orchard_env_server.backends.docker.spec import container_spec
from orchard_env_server.backends.hardening import (
    SANDBOX_CAPABILITIES,
    capability_mask,
    engine_seccomp_warning,
)
from orchard_env_server.quantities import parse_cpu, parse_memory
from orchard_env_server.records import SandboxRecord
from orchard_env_server.settings import Settings
from orchard_env_server.unix_sockets import PinnedUnixConnector, pinned_socket

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("text", "cores"), [("2", 2.0), ("0.5", 0.5), ("500m", 0.5), ("1500m", 1.5)]
)
def test_cpu_quantities(text, cores):
    assert parse_cpu(text) == cores


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512Mi", 512 << 20),
        ("1Gi", 1 << 30),
        ("1G", 10**9),
        ("64k", 64 << 10),
        ("512m", 512 << 20),
        ("1.5Gi", 3 << 29),
        ("1000", 1000),
    ],
)
def test_memory_quantities(text, size):
    assert parse_memory(text) == size


@pytest.mark.parametrize("text", ["lots", "", "1X", "-5Mi", "Mi"])
def test_bad_memory_quantities_are_errors(text):
    with pytest.raises(ValueError):
        parse_memory(text)


def test_zero_cpu_is_an_error():
    with pytest.raises(ValueError):
        parse_cpu("0m")


def _spec(settings: Settings | None = None, **fields):
    record = SandboxRecord(sandbox_id="sbx-1", tenant="alice", image="img:1", **fields)
    return container_spec(
        record, settings or Settings(), "orch-x", AgentMount("volume", "vol"), "/run/x"
    )


def test_the_spec_replaces_the_entrypoint_with_the_agent_and_keeps_the_image_config():
    spec = _spec(env={"A": "1"})
    assert spec["Entrypoint"] == agent_entry()
    assert spec["Cmd"][:4] == [
        "--uds",
        "/.orchard/run/agent.sock",
        "--token-file",
        "/.orchard/run/token",
    ]
    assert "WorkingDir" not in spec and "User" not in spec  # the image's own stay in force
    assert spec["Env"] == ["ORCHARD_SANDBOX_ID=sbx-1", "A=1"]  # no token, no token file
    assert spec["Labels"] == {
        "orchard.dev/sandbox-id": "sbx-1",
        "orchard.dev/tenant": "alice",
        "orchard.dev/orchestrator": "orch-x",
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


# Docker's default set (moby's oci/caps/defaults.go) less MKNOD, NET_RAW and AUDIT_WRITE.
KEPT = {
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}


def test_the_sandbox_capability_set_is_dockers_default_less_three():
    assert set(SANDBOX_CAPABILITIES) == KEPT
    assert capability_mask() == 0x800405FB  # CapEff of root keeping exactly these


@pytest.mark.parametrize("block_network", [True, False])
def test_the_container_drops_every_capability_but_the_kept_set(block_network):
    host = _spec(block_network=block_network)["HostConfig"]
    assert host["CapDrop"] == ["ALL"]
    assert set(host["CapAdd"]) == KEPT
    assert host["SecurityOpt"] == ["no-new-privileges"]  # and so the engine's seccomp profile
    assert host["Privileged"] is False


@pytest.mark.parametrize("block_network", [True, False])
def test_the_container_gets_nothing_of_the_host(block_network):
    """No host namespace, device, path, socket or published port: only the two mounts."""
    spec = _spec(block_network=block_network)
    host = spec["HostConfig"]
    for key in (
        "PidMode",
        "IpcMode",
        "UTSMode",
        "UsernsMode",
        "CgroupnsMode",
        "Devices",
        "DeviceRequests",
        "DeviceCgroupRules",
        "Binds",
        "VolumesFrom",
        "PortBindings",
        "CapabilityAdd",
        "Sysctls",
        "Runtime",
        "Isolation",
    ):
        assert key not in host, key
    assert "ExposedPorts" not in spec and "Volumes" not in spec
    assert host["PublishAllPorts"] is False
    assert host["NetworkMode"] in ("none", "bridge")
    agent, run = host["Mounts"]
    assert (agent["Target"], agent["ReadOnly"]) == ("/.orchard/agent", True)
    assert (run["Type"], run["Source"], run["Target"]) == ("bind", "/run/x", "/.orchard/run")


def test_the_memory_limit_leaves_no_swap_and_pids_are_always_limited():
    host = _spec()["HostConfig"]
    assert host["PidsLimit"] == Settings().pids_limit > 0
    assert host["Memory"] == host["MemorySwap"] == 4 << 30  # none asked: --memory-default
    unlimited = _spec(settings=Settings(memory_default=None))["HostConfig"]
    assert "Memory" not in unlimited


@pytest.mark.parametrize(
    ("options", "warned"),
    [
        (["name=seccomp,profile=default"], False),
        (["name=apparmor", "name=seccomp,profile=builtin", "name=cgroupns"], False),
        (["name=seccomp,profile=unconfined"], True),
        (["name=apparmor"], True),
        (None, True),
    ],
)
def test_an_engine_without_a_seccomp_default_is_reported(options, warned):
    assert (engine_seccomp_warning(options) is not None) is warned


def _listening(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    return server


def test_a_pinned_socket_reaches_the_socket_and_refuses_what_replaced_it(tmp_path: Path):
    real = tmp_path / "real.sock"
    server = _listening(real)
    open_fds = len(os.listdir("/proc/self/fd"))
    with pinned_socket(str(real)) as path:
        client = socket.socket(socket.AF_UNIX)
        client.connect(path)
        client.close()
    # What code inside a sandbox could leave where its agent socket was:
    (tmp_path / "agent.sock").symlink_to(real)
    (tmp_path / "file").write_text("x")
    for bad in ("agent.sock", "file", "missing"):
        with pytest.raises(OSError), pinned_socket(str(tmp_path / bad)):
            pass
    assert len(os.listdir("/proc/self/fd")) == open_fds  # the pinning fds are closed
    server.close()


async def test_the_agent_connector_does_not_follow_a_symlinked_socket(tmp_path: Path):
    """A sandbox that swaps its agent socket for a link to a host socket (the Docker
    engine's, say) gets a connection error, not the orchestrator's request."""
    host_socket = tmp_path / "host.sock"
    server = _listening(host_socket)
    link = tmp_path / "agent.sock"
    link.symlink_to(host_socket)
    async with aiohttp.ClientSession(connector=PinnedUnixConnector(path=str(link))) as http:
        with pytest.raises(aiohttp.ClientConnectorError, match="not a unix socket"):
            await http.get("http://sandbox/health")
    server.settimeout(0)
    with pytest.raises(BlockingIOError):
        server.accept()  # nothing ever connected to the host's socket
    server.close()


@given(st.lists(st.tuples(st.sampled_from([1, 2]), st.binary(max_size=300)), max_size=8))
def test_log_frames_are_demultiplexed(frames):
    raw = b"".join(bytes([kind, 0, 0, 0]) + len(p).to_bytes(4, "big") + p for kind, p in frames)
    assert _demultiplex(raw) == b"".join(p for _, p in frames)

"""The escape suite: what runs on the host. Its unix sockets (the Docker engine, containerd,
the kubelet), services on its loopback (one the test starts, the orchestrator itself) and
its processes (a ``sleep`` the test starts, to be traced). See test_privileges.py for the
suite and how to run it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import psutil
import pytest
from security.probing import (
    CONNECT_PROBE,
    PROCESS_PROBE,
    MarkerService,
    assert_unreached,
    connections_made,
    run_probe,
    sleep_marker,
    succeeded,
)

pytestmark = [pytest.mark.integration, pytest.mark.security]

NAMED_SOCKETS = [
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/run/docker/containerd/containerd.sock",
    "/run/dockershim.sock",
    "/var/lib/kubelet/device-plugins/kubelet.sock",
]
SOCKET_DIRS = ["/run", "/var/run", "/var/lib/kubelet", "/var/lib/docker", "/var/tmp"]


def _host_sockets() -> tuple[list[str], list[str]]:
    """The host's unix sockets: named ones on its filesystem (a bounded walk of where
    daemons keep them) and abstract ones (``@name``, seen through its network namespace)."""
    named = {p for p in NAMED_SOCKETS}
    seen = 0
    for top in SOCKET_DIRS:
        for root, dirs, files in os.walk(top):
            seen += 1
            if seen > 5000 or root.count("/") > 8:
                dirs[:] = []
            for name in files:
                path = os.path.join(root, name)
                try:
                    if Path(path).is_socket():
                        named.add(path)
                except OSError:
                    pass
    abstract = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith("@"):
            abstract.add(fields[7])
    return sorted(named), sorted(abstract)[:60]


UNIX_PROBE = """
import socket
def connect(address):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2)
    try:
        sock.connect(address)
    finally:
        sock.close()
out["named"] = {path: attempt(connect, path) for path in ARGS["named"]}
out["abstract"] = {name: attempt(connect, "\\0" + name[1:]) for name in ARGS["abstract"]}
"""


def test_a_sandbox_cannot_connect_to_host_unix_sockets(open_sandbox):
    """The Docker engine's socket is root on the host; containerd's, the kubelet's too."""
    named, abstract = _host_sockets()
    assert "/run/docker.sock" in named
    result = run_probe(open_sandbox, UNIX_PROBE, named=named, abstract=abstract)
    assert len(result["named"]) == len(named), result
    assert succeeded(result["named"]) == {}, result["named"]
    assert succeeded(result["abstract"]) == {}, result["abstract"]


NETWORKS = pytest.mark.parametrize("block_network", [True, False], ids=["blocked", "open"])


@NETWORKS
def test_a_sandbox_cannot_reach_a_service_on_the_hosts_loopback(
    blocked_sandbox, open_sandbox, block_network
):
    sandbox = blocked_sandbox if block_network else open_sandbox
    with MarkerService() as service:
        result = run_probe(
            sandbox,
            CONNECT_PROBE,
            timeout=120,
            ports=[service.port],
            targets=[("127.0.0.1", service.port), ("localhost", service.port)],
        )
    assert connections_made(result) == {}, result
    assert service.accepted == [], f"the host service was reached from {service.accepted}"


@NETWORKS
def test_a_sandbox_cannot_reach_the_orchestrators_api(
    blocked_sandbox, open_sandbox, block_network, server
):
    sandbox = blocked_sandbox if block_network else open_sandbox
    port = urlparse(server.url).port
    result = run_probe(
        sandbox,
        CONNECT_PROBE,
        timeout=120,
        ports=[port],
        targets=[("127.0.0.1", port), ("localhost", port)],
    )
    assert connections_made(result) == {}, result


def test_a_sandbox_with_a_blocked_network_reaches_no_host_service(blocked_sandbox):
    """A service listening on every interface of the host, tried at each of its addresses."""
    addresses = sorted(
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family.name == "AF_INET"
    )
    with MarkerService(host="0.0.0.0") as service:
        targets = [(address, service.port) for address in addresses]
        result = run_probe(
            blocked_sandbox, CONNECT_PROBE, timeout=180, ports=[service.port], targets=targets
        )
    assert connections_made(result) == {}, result
    assert service.accepted == [], f"the host service was reached from {service.accepted}"


def test_a_sandbox_cannot_see_or_trace_a_host_process(blocked_sandbox):
    marker = sleep_marker()
    sleeper = subprocess.Popen(["sleep", marker])
    try:
        result = run_probe(blocked_sandbox, PROCESS_PROBE, marker=marker, pids=[sleeper.pid])
        assert_unreached(result, sleeper.pid)
        assert sleeper.poll() is None, "the host process died"
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)

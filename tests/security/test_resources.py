"""The escape suite: resources. A fork bomb is held at the sandbox's pids limit (watched
from the host, in the sandbox's cgroup) while the orchestrator and a bystander sandbox
keep answering; a memory hog is killed at the memory limit and the sandbox lives on. See
test_privileges.py for the suite and how to run it."""

from __future__ import annotations

import time

import httpx
import pytest
from security.probing import pids_limit_of, sleep_marker, wait_for_host_pid

from orchard_env_client import SandboxClient
from orchard_testing import wait_until_it_runs_again

pytestmark = [pytest.mark.integration, pytest.mark.security]

PIDS_LIMIT = 64  # given to the orchestrator (--pids-limit)
# The most processes a sandbox may hold on each backend: the orchestrator's setting, except
# on Kubernetes, where the kubelet's podPidsLimit of the test cluster (infra/test-cluster/up)
# is what holds a pod.
PIDS_BOUND = {"local": PIDS_LIMIT, "docker": PIDS_LIMIT, "kubernetes": 4096}


def test_a_fork_bomb_is_held_at_the_pids_limit_and_the_service_stays_up(fresh_server, image):
    fresh_server.start("--pids-limit", str(PIDS_LIMIT))
    with SandboxClient(base_url=fresh_server.url) as client:
        sandbox = client.create_sandbox(image)
        bystander = client.create_sandbox(image)
        marker = sleep_marker()
        sandbox.start(f"exec sleep {marker}", timeout=600)
        cgroup, limit = pids_limit_of(wait_for_host_pid(marker))
        assert limit <= PIDS_BOUND[fresh_server.backend], f"{cgroup} allows {limit} processes"
        bomb = sandbox.start("bomb() { bomb | bomb & }; bomb; sleep 30", timeout=4)
        peak, deadline = 0, time.monotonic() + 3
        while time.monotonic() < deadline:
            peak = max(peak, int((cgroup / "pids.current").read_text()))
            time.sleep(0.05)
        assert peak <= limit
        started = time.monotonic()
        assert bystander.exec("echo unaffected", timeout=20).stdout == "unaffected\n"
        assert httpx.get(fresh_server.url + "/health", timeout=10).status_code == 200
        assert time.monotonic() - started < 20, "the service slowed to a crawl"
        assert bomb.wait(timeout=60).status == "failed", "the bomb's job did not end"
        wait_until_it_runs_again(sandbox, seconds=60)


def test_a_memory_hog_is_killed_and_the_sandbox_lives_on(client, image):
    with client.create_sandbox(image, memory="64Mi") as sandbox:
        hog = sandbox.exec(
            "python3 -c 'b = bytearray(400 << 20); print(\"survived\")'", timeout=120
        )
        assert "survived" not in hog.stdout, "400 MiB fit in a 64 MiB sandbox"
        assert hog.exit_code == 137 or (hog.error and "signal 9" in hog.error), hog
        assert sandbox.exec("echo alive", timeout=30).stdout == "alive\n"
        assert sandbox.refresh().status == "ready"

"""The Docker backend's own mechanisms, against the real engine: injection into any image,
confinement (capabilities, seccomp, nothing of the host), limits, egress, containers dying
behind the orchestrator's back, adoption after a restart.

The shared suite (test_exec, test_files, ...) runs on Docker too; this file holds what only
a container engine has.
"""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from orchard_env_client import SandboxClient
from orchard_env_client.errors import OrchardError, SandboxFailed
from orchard_env_server.backends.hardening import SANDBOX_CAPABILITIES, capability_mask
from orchard_testing import BUSYBOX_IMAGE, docker, leftovers, only_backend, wait_until_it_runs_again

pytestmark = [pytest.mark.integration, only_backend("docker")]


@pytest.fixture(scope="module")
def client(server):
    with SandboxClient(base_url=server.url) as c:
        yield c


def _container(sandbox_id: str) -> dict:
    return json.loads(docker("inspect", f"orchard-{sandbox_id}"))[0]


def _pids_cgroup(pid: int) -> Path:
    """The host directory of the pids cgroup a process is in (cgroup v1 or v2)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return Path("/sys/fs/cgroup/pids" + path)
        if controllers == "":  # the v2 unified hierarchy
            return Path("/sys/fs/cgroup" + path)
    raise AssertionError(f"no pids cgroup for pid {pid}")


def _wait_status(client: SandboxClient, sandbox_id: str, status: str, within: float = 15):
    deadline = time.monotonic() + within
    while True:
        info = client.get_sandbox(sandbox_id).refresh()
        if info.status == status or time.monotonic() > deadline:
            return info
        time.sleep(0.1)


def test_health_names_the_backend(server):
    health = httpx.get(server.url + "/health").json()
    assert (health["backend"], health["isolation"]) == ("docker", "docker")


def test_the_agent_is_injected_into_an_image_with_nothing_but_busybox(client):
    sbx = client.create_sandbox(BUSYBOX_IMAGE)
    assert sbx.refresh().status == "ready"
    job = sbx.exec("readlink /bin/sh; ls /usr/bin/python3 /usr/lib/python3* 2>&1 | head -1")
    assert job.stdout.splitlines()[0] == "busybox"  # the image's own shell runs the command
    assert "No such file" in job.stdout  # and the image has no Python of its own
    pid1 = sbx.exec("tr '\\0' ' ' < /proc/1/cmdline").stdout
    assert pid1.startswith("/.orchard/agent/lib/ld-linux-x86-64.so.2 ")
    sbx.upload_content("/tmp/x.bin", bytes(range(256)) * 64)
    assert sbx.download_content("/tmp/x.bin") == bytes(range(256)) * 64
    assert sbx.exec("wc -c < /tmp/x.bin").stdout.strip() == "16384"
    sbx.delete()


def test_the_images_workdir_env_and_user_are_honoured(client, tmp_path: Path):
    (tmp_path / "Dockerfile").write_text(
        f"FROM {BUSYBOX_IMAGE}\nRUN mkdir -p /srv/app && chown nobody /srv/app\n"
        "WORKDIR /srv/app\nENV GREETING=from-image\nUSER nobody\n"
    )
    docker("build", "-q", "-t", "orchard-test/custom:latest", str(tmp_path))
    try:
        sbx = client.create_sandbox("orchard-test/custom", env={"EXTRA": "from-create"})
        job = sbx.exec("pwd; echo $GREETING $EXTRA; id -u; touch made-here && echo wrote")
        assert job.stdout.split("\n")[:4] == [
            "/srv/app",
            "from-image from-create",
            "65534",
            "wrote",
        ]
        assert sbx.exec("env").stdout.count("ORCHARD_AGENT_TOKEN") == 0
        sbx.delete()
    finally:
        docker("rmi", "-f", "orchard-test/custom:latest", check=False)


def _proc_status(sbx, fields: str = "Cap|Seccomp|NoNewPrivs") -> dict[str, str]:
    out = sbx.exec(f"grep -E '^({fields})' /proc/self/status").stdout
    return {k: v.strip() for k, v in (line.split(":", 1) for line in out.splitlines())}


@pytest.mark.parametrize("block_network", [True, False])
def test_the_container_keeps_only_the_sandbox_capabilities_and_gets_nothing_of_the_host(
    client, block_network
):
    sbx = client.create_sandbox(BUSYBOX_IMAGE, block_network=block_network)
    container = _container(sbx.sandbox_id)
    host = container["HostConfig"]
    assert host["CapDrop"] == ["ALL"]
    assert sorted(host["CapAdd"]) == sorted(SANDBOX_CAPABILITIES)
    assert host["SecurityOpt"] == ["no-new-privileges"]  # no seccomp=unconfined, no apparmor
    assert host["Privileged"] is False and host["PublishAllPorts"] is False
    assert not host.get("PortBindings") and not container["NetworkSettings"]["Ports"]
    assert not host.get("Devices") and not host.get("Binds")
    assert (host["PidMode"], host["UsernsMode"], host["UTSMode"]) == ("", "", "")
    assert host["IpcMode"] != "host" and host["NetworkMode"] != "host"
    assert sorted(m["Destination"] for m in container["Mounts"]) == [
        "/.orchard/agent",
        "/.orchard/run",
    ]
    assert [m["RW"] for m in container["Mounts"] if m["Destination"] == "/.orchard/agent"] == [
        False
    ]
    # Inside, a root shell holds exactly the kept set, under the engine's seccomp filter.
    assert sbx.exec("id -u").stdout == "0\n"
    status = _proc_status(sbx)
    for field in ("CapEff", "CapPrm", "CapBnd"):
        assert int(status[field], 16) == capability_mask(), (field, status)
    assert int(status["CapAmb"], 16) == 0
    assert (status["Seccomp"], status["NoNewPrivs"]) == ("2", "1")
    refused = sbx.exec("mknod /tmp/disk b 8 0 && echo made")
    assert refused.exit_code != 0 and "made" not in refused.stdout
    assert sbx.exec("touch /tmp/owned && chown 65534:65534 /tmp/owned && echo ok").stdout == (
        "ok\n"
    )  # what stays: a root shell still owns its files
    sbx.delete()


def test_an_agent_socket_replaced_by_a_symlink_is_not_followed(client, tmp_path: Path):
    """The run directory is the sandbox's to write: a command can swap the agent's socket
    for a link to a host socket. The orchestrator connects only to a socket, never through
    a link, so the host's socket (here a trap of the test's own) gets no connection."""
    trap_path = tmp_path / "host.sock"
    trap = socket.socket(socket.AF_UNIX)
    trap.bind(str(trap_path))
    trap.listen(16)
    trap.setblocking(False)
    sbx = client.create_sandbox(BUSYBOX_IMAGE)
    swap = sbx.exec(f"rm /.orchard/run/agent.sock && ln -s {trap_path} /.orchard/run/agent.sock")
    assert swap.exit_code == 0, swap

    def one_more(_: int) -> str:
        try:
            return str(sbx.exec("sleep 0.5; echo done", timeout=10).error)
        except OrchardError as exc:
            return str(exc)

    # Concurrent commands need new connections beyond the one kept alive.
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one_more, range(4)))
    assert any("not a unix socket" in a for a in answers), answers
    with pytest.raises(BlockingIOError):
        trap.accept()
    trap.close()
    sbx.delete()


def test_cpu_memory_and_pids_become_container_limits(client):
    sbx = client.create_sandbox(BUSYBOX_IMAGE, cpu="500m", memory="64Mi")
    host = _container(sbx.sandbox_id)["HostConfig"]
    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == host["MemorySwap"] == 64 << 20
    assert host["PidsLimit"] == 1024
    assert host["SecurityOpt"] == ["no-new-privileges"]
    sbx.delete()


def test_a_memory_hog_is_killed_and_the_sandbox_lives_on(client):
    sbx = client.create_sandbox(BUSYBOX_IMAGE, memory="64Mi")
    # The shell keeps the whole substitution in memory: it grows until the limit.
    job = sbx.exec("x=$(head -c 400000000 /dev/zero | tr '\\0' a); echo survived", timeout=60)
    assert "survived" not in job.stdout
    assert job.exit_code == 137 or (job.error and "signal 9" in job.error), job
    # The killed shell's memory is given back as the kernel reaps it: under load a command
    # started at once may find the cgroup still full. The sandbox must answer soon after.
    deadline = time.monotonic() + 30
    while (alive := sbx.exec("echo alive")).stdout != "alive\n":
        assert time.monotonic() < deadline, alive
        time.sleep(0.5)
    assert sbx.refresh().status == "ready"
    sbx.delete()


def test_a_fork_bomb_is_contained_by_the_pids_limit(fresh_server):
    fresh_server.start("--pids-limit", "64")
    with SandboxClient(base_url=fresh_server.url) as client:
        sbx = client.create_sandbox(BUSYBOX_IMAGE)
        pids_max = _pids_cgroup(_container(sbx.sandbox_id)["State"]["Pid"]) / "pids.max"
        job = sbx.start("bomb() { bomb | bomb & }; bomb; sleep 30", timeout=4)
        time.sleep(2)
        assert pids_max.read_text().strip() == "64"
        current = int(pids_max.with_name("pids.current").read_text())
        assert current <= 64
        assert httpx.get(fresh_server.url + "/health").status_code == 200
        result = job.wait(timeout=30)
        assert result.status == "failed"
        wait_until_it_runs_again(sbx)  # forks fail while the bomb's last processes die
        sbx.delete()


def test_blocked_egress_leaves_only_loopback_inside(client):
    sbx = client.create_sandbox(BUSYBOX_IMAGE)  # block_network defaults to true
    assert sbx.exec("ls /sys/class/net").stdout.split() == ["lo"]
    routes = sbx.exec("cat /proc/net/route").stdout.strip().splitlines()
    assert len(routes) == 1 and routes[0].startswith("Iface")  # the header, no route at all
    assert _container(sbx.sandbox_id)["HostConfig"]["NetworkMode"] == "none"
    sbx.delete()


def test_allowed_egress_has_an_interface_and_a_default_route(client):
    sbx = client.create_sandbox(BUSYBOX_IMAGE, block_network=False)
    interfaces = sbx.exec("ls /sys/class/net").stdout.split()
    assert "lo" in interfaces and len(interfaces) >= 2
    routes = [line.split() for line in sbx.exec("cat /proc/net/route").stdout.splitlines()[1:]]
    assert any(r[1] == "00000000" for r in routes), routes  # a default route exists
    sbx.delete()


def test_a_container_killed_behind_the_orchestrators_back_fails_the_sandbox(client):
    sbx = client.create_sandbox(BUSYBOX_IMAGE)
    docker("kill", f"orchard-{sbx.sandbox_id}")
    info = _wait_status(client, sbx.sandbox_id, "failed")
    assert info.status == "failed" and "exited with code 137" in (info.error or "")
    with pytest.raises(OrchardError) as err:
        sbx.exec("true")
    assert err.value.status == 409 and "exited" in str(err.value)


def test_a_container_removed_behind_the_orchestrators_back_fails_the_sandbox(client):
    sbx = client.create_sandbox(BUSYBOX_IMAGE)
    docker("rm", "-f", f"orchard-{sbx.sandbox_id}")
    info = _wait_status(client, sbx.sandbox_id, "failed")
    assert info.status == "failed"
    assert "removed" in (info.error or "") or "exited" in (info.error or "")


def test_a_container_that_cannot_start_fails_with_the_engines_reason(client):
    with pytest.raises(SandboxFailed, match="not a directory"):
        client.create_sandbox(BUSYBOX_IMAGE, workdir="/etc/passwd")


def test_an_image_that_is_not_there_fails_clearly(client):
    with pytest.raises(SandboxFailed, match="not on the Docker engine"):
        client.create_sandbox("orchard-test/no-such-image:1")


def test_a_restarted_orchestrator_adopts_live_containers_and_reaps_orphans(fresh_server):
    fresh_server.start()
    with SandboxClient(base_url=fresh_server.url, auto_cleanup=False) as client:
        kept = client.create_sandbox(BUSYBOX_IMAGE)
        kept.exec("echo kept > /tmp/proof")
        orphan = client.create_sandbox(BUSYBOX_IMAGE)
    fresh_server.kill()
    # The orphan's record is lost: its container must not outlive the restart.
    (fresh_server.state_dir / "docker" / orphan.sandbox_id / "record.json").unlink()
    fresh_server.start()
    with SandboxClient(base_url=fresh_server.url) as client:
        again = client.get_sandbox(kept.sandbox_id)
        assert again.exec("cat /tmp/proof").stdout == "kept\n"
        with pytest.raises(OrchardError):
            client.get_sandbox(orphan.sandbox_id).refresh()
        assert leftovers(fresh_server) == [f"orchard-{kept.sandbox_id}"]
    fresh_server.stop()
    assert leftovers(fresh_server) == []

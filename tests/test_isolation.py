"""The local backend's bubblewrap isolation: filesystem, processes and network."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from orchard_env_client import SandboxClient
from orchard_testing import create_ready, only_backend, wait_for_removals, wait_until_it_runs_again

pytestmark = [
    pytest.mark.integration,
    only_backend("local"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]


@pytest.fixture(scope="module")
def client(server):
    assert httpx.get(server.url + "/health").json()["isolation"] == "bubblewrap"
    with SandboxClient(base_url=server.url) as c:
        yield c


def test_the_host_filesystem_is_read_only(client):
    sbx = client.create_sandbox("host")
    job = sbx.exec("touch /usr/orchard-test 2>&1; echo rc=$?")
    assert "rc=1" in job.stdout and "Read-only" in job.stdout


def test_tmp_and_workspace_are_private_to_each_sandbox(client):
    a, b = client.create_sandbox("host"), client.create_sandbox("host")
    a.exec("echo secret > /tmp/mine; echo w > /workspace/mine")
    assert b.exec("cat /tmp/mine /workspace/mine").exit_code != 0


def test_processes_of_other_sandboxes_are_invisible(client):
    a, b = client.create_sandbox("host"), client.create_sandbox("host")
    a.start("sleep 123.456")
    assert "123.456" not in b.exec("ps -eo args").stdout


def test_a_blocked_network_has_only_loopback(client):
    sbx = client.create_sandbox("host", block_network=True)
    assert sbx.exec("ls /sys/class/net 2>/dev/null || ip -o link").exit_code in (0, 1, 2)
    routes = sbx.exec("cat /proc/net/route").stdout.strip().splitlines()
    assert routes[1:] == []
    dev = sbx.exec("cat /proc/net/dev").stdout
    assert "lo:" in dev and "eth0" not in dev


def _backend_state(server, sandbox_id: str) -> dict:
    record = server.state_dir / "sandboxes" / sandbox_id / "record.json"
    return json.loads(record.read_text())["backend_state"]


def test_an_open_network_is_a_namespace_of_its_own_with_user_mode_egress(server, client):
    sbx = client.create_sandbox("host", block_network=False)
    dev = sbx.exec("cat /proc/net/dev").stdout
    assert "tap0:" in dev and "lo:" in dev and dev.count(":") == 2  # not the host's devices
    assert "0202000A" in sbx.exec("cat /proc/net/route").stdout  # default via 10.0.2.2
    assert sbx.exec("cat /etc/resolv.conf").stdout == "nameserver 10.0.2.3\n"
    state = _backend_state(server, sbx.sandbox_id)
    host_net = os.stat("/proc/self/ns/net").st_ino
    assert os.stat(f"/proc/{state['holder_pid']}/ns/net").st_ino != host_net
    egress = state["egress_pid"]
    assert "slirp4netns" in Path(f"/proc/{egress}/cmdline").read_text()
    sbx.delete()
    wait_for_removals(server.url)
    assert not Path(f"/proc/{egress}").exists() or "slirp4netns" not in (
        Path(f"/proc/{egress}/cmdline").read_text()
    ), "slirp4netns outlived its sandbox"


def test_sandbox_root_is_an_unprivileged_host_uid_of_its_own(server, client):
    a, b = client.create_sandbox("host"), client.create_sandbox("host")
    a.exec("touch /workspace/made-inside")
    a.upload_content("/workspace/uploaded", "x")
    uid_a = _backend_state(server, a.sandbox_id)["uid"]
    uid_b = _backend_state(server, b.sandbox_id)["uid"]
    assert uid_a >= 1_000_000_000 and uid_b >= 1_000_000_000 and uid_a != uid_b
    workspace = server.state_dir / "sandboxes" / a.sandbox_id / "workspace"
    for name in ("made-inside", "uploaded"):
        st = (workspace / name).stat()
        assert (st.st_uid, st.st_gid) == (uid_a, uid_a), name
    assert a.exec("id -u; stat -c %u /workspace/uploaded").stdout == "0\n0\n"
    assert a.exec("echo more >> /workspace/uploaded").exit_code == 0


def test_the_host_view_is_minimal(client):
    sbx = client.create_sandbox("host")
    top = set(sbx.exec("ls -A /").stdout.split())
    assert top <= {
        "bin",
        "sbin",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "usr",
        "etc",
        "dev",
        "proc",
        "tmp",
        "workspace",
    }, top
    etc = set(sbx.exec("ls -A /etc").stdout.split())
    assert "shadow" not in etc and "ssh" not in etc and "machine-id" not in etc
    assert {"passwd", "os-release", "ld.so.cache"} <= etc
    assert sbx.exec("python3 -c 'print(6 * 7)'").stdout == "42\n"


def _minimal_rootfs(root: Path) -> Path:
    """A root filesystem holding only a few host binaries and the libraries they link."""
    for tool in ("bash", "sh", "cat", "sleep", "ls"):
        exe = Path(shutil.which(tool) or f"/bin/{tool}").resolve()
        libs = subprocess.run(["ldd", str(exe)], capture_output=True, text=True).stdout
        paths = [exe] + [Path(p) for p in re.findall(r"(/\S+) \(0x", libs)]
        for path in paths:
            target = root / "bin" / tool if path == exe else root / str(path).lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                shutil.copy2(path, target)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc" / "marker").write_text("custom-root\n")
    return root


def test_a_root_filesystem_directory_is_an_image(client, tmp_path):
    sbx = client.create_sandbox(str(_minimal_rootfs(tmp_path / "rootfs")))
    assert sbx.exec("cat /etc/marker; ls /").stdout.startswith("custom-root\n")
    assert sbx.exec("ls /usr/bin/python3").exit_code != 0


def test_a_root_filesystem_archive_is_an_image(client, tmp_path):
    root = _minimal_rootfs(tmp_path / "rootfs")
    archive = tmp_path / "rootfs.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname=".")
    sbx = client.create_sandbox(str(archive))
    assert sbx.exec("cat /etc/marker").stdout == "custom-root\n"


def _cgroup_dir(server, sandbox_id: str, controller: str) -> Path:
    """The sandbox's cgroup (v1: under the controller's hierarchy; v2: the one tree)."""
    procs = json.loads((server.state_dir / "sandboxes" / sandbox_id / "record.json").read_text())[
        "backend_state"
    ]["cgroup_procs"]
    for path in procs:
        if Path("/sys/fs/cgroup/cgroup.controllers").exists() or f"/{controller}/" in path:
            return Path(path).parent
    raise AssertionError(f"no {controller} cgroup in {procs}")


def test_a_memory_hog_is_killed_and_the_sandbox_lives_on(server, client):
    sbx = client.create_sandbox("host", memory="64Mi")
    memory = _cgroup_dir(server, sbx.sandbox_id, "memory")
    limit = memory / ("memory.max" if (memory / "memory.max").exists() else "memory.limit_in_bytes")
    assert int(limit.read_text()) == 64 << 20
    job = sbx.exec("python3 -c 'b = bytearray(400 << 20); print(\"survived\")'", timeout=60)
    assert "survived" not in job.stdout
    assert job.exit_code == 137 or (job.error and "signal 9" in job.error), job
    assert sbx.exec("echo alive").stdout == "alive\n"
    assert sbx.refresh().status == "ready"
    sbx.delete()
    wait_for_removals(server.url)
    assert not memory.exists(), "the sandbox's cgroup outlived it"


def test_commands_run_inside_the_sandboxs_cgroups(server, client):
    sbx = client.create_sandbox("host", cpu="0.5")
    pids = _cgroup_dir(server, sbx.sandbox_id, "pids")
    assert int((pids / "pids.max").read_text()) == 1024  # the default --pids-limit
    inside = sbx.exec("cat /proc/self/cgroup").stdout
    assert sbx.sandbox_id in inside, inside
    cpu = _cgroup_dir(server, sbx.sandbox_id, "cpu")
    quota = (
        (cpu / "cpu.max").read_text().split()[0]
        if (cpu / "cpu.max").exists()
        else ((cpu / "cpu.cfs_quota_us").read_text().strip())
    )
    assert int(quota) == 50_000
    sbx.delete()


def test_a_fork_bomb_is_held_at_the_pids_limit(fresh_server):
    srv = fresh_server
    srv.start("--pids-limit", "64")
    with SandboxClient(base_url=srv.url) as c:
        sbx = c.create_sandbox("host")
        bystander = c.create_sandbox("host")
        pids = _cgroup_dir(srv, sbx.sandbox_id, "pids")
        job = sbx.start("bomb() { bomb | bomb & }; bomb; sleep 30", timeout=4)
        time.sleep(2)
        assert int((pids / "pids.current").read_text()) <= 64
        assert bystander.exec("echo unaffected", timeout=10).stdout == "unaffected\n"
        assert httpx.get(srv.url + "/health").status_code == 200
        assert job.wait(timeout=30).status == "failed"
        wait_until_it_runs_again(sbx)  # forks fail while the bomb's last processes die
        sbx.delete()
        wait_for_removals(srv.url)
        assert not pids.exists()


def test_a_cpu_limit_that_cannot_apply_fails_the_sandbox_and_leaks_no_holder(server, client):
    response = httpx.post(f"{server.url}/sandboxes", json={"image": "host", "cpu": "0"})
    if response.status_code == 422:  # refused up front: nothing was made
        return
    body = response.json()
    assert body["status"] == "failed" and "cpu" in body["error"], body
    holders = subprocess.run(
        ["pgrep", "-f", f"--hostname {body['sandbox_id']}"], capture_output=True, text=True
    )
    assert holders.stdout.strip() == "", "the failed sandbox's holder is still running"
    # A tiny but valid share is raised to the kernel's 1 ms minimum, not refused.
    tiny = client.create_sandbox("host", cpu="1m")
    assert tiny.exec("echo ok").stdout == "ok\n"
    tiny.delete()


def test_the_wheels_bwrap_is_used_without_debians_and_runs_as_a_sandbox_uid(
    backend, monkeypatch, request
):
    from orchard_env_server.backends.local import bubblewrap

    real_which = shutil.which
    monkeypatch.setattr(
        bubblewrap.shutil,
        "which",
        lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k),
    )
    # Like /run/orchard-env: a directory any uid may walk to (pytest's tmp_path is private).
    runtime = Path(tempfile.mkdtemp(prefix="orchard-bwrap-", dir="/tmp"))
    runtime.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(runtime, ignore_errors=True))
    exe = bubblewrap.bwrap_path(runtime)
    assert exe is not None and exe.startswith(str(runtime)), exe
    version = subprocess.run(
        [
            "setpriv",
            "--reuid",
            "1000000000",
            "--regid",
            "1000000000",
            "--clear-groups",
            exe,
            "--version",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert version.startswith("bubblewrap ")


def test_an_adopted_sandbox_keeps_its_etc_across_a_restart(fresh_server):
    fresh_server.start()
    with SandboxClient(base_url=fresh_server.url) as c:
        sbx = c.create_sandbox("host", block_network=False)
        assert sbx.exec("cat /etc/passwd").stdout.startswith("root:")
        fresh_server.kill()
        fresh_server.start()
        again = c.get_sandbox(sbx.sandbox_id)
        assert again.exec("cat /etc/passwd").stdout.startswith("root:")
        assert again.exec("cat /etc/resolv.conf").stdout == "nameserver 10.0.2.3\n"
        assert again.download_content("/etc/hosts").startswith(b"127.0.0.1")


def test_an_isolated_server_does_not_adopt_an_unisolated_sandbox(fresh_server):
    fresh_server.start("--isolation", "none")
    url = fresh_server.url
    sid = str(create_ready(url, {"image": "host"})["sandbox_id"])
    fresh_server.kill()
    fresh_server.start()
    body = httpx.get(f"{url}/sandboxes/{sid}").json()
    assert body["status"] == "failed", body
    assert not (fresh_server.state_dir / "sandboxes" / sid).exists()

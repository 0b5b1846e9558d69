"""orchard-enter, the compiled sandbox entry: namespaces, cgroups, credentials and seccomp."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_harness import start_holder

from orchard_env_agent import enter

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not shutil.which("bwrap") or not shutil.which("cc") or os.geteuid() != 0,
        reason="needs bwrap, a C compiler and root",
    ),
]


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[int]:
    ws = tmp_path / "ws"
    ws.mkdir()
    proc, pid = start_holder(ws)
    yield pid
    os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def helper(tmp_path_factory: pytest.TempPathFactory) -> str:
    cache = tmp_path_factory.mktemp("enter-cache")
    os.environ["ORCHARD_AGENT_CACHE_DIR"] = str(cache)
    enter.helper.cache_clear()
    try:
        built = enter.helper()
    finally:
        del os.environ["ORCHARD_AGENT_CACHE_DIR"]
        enter.helper.cache_clear()
    assert built is not None and built.startswith(str(cache))
    assert os.stat(cache).st_mode & 0o077 == 0  # a private cache: no one else swaps it
    return built


def _enter(
    helper: str, holder: int, cwd: str, argv: list[str]
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        enter.enter_argv(helper, holder, cwd, [], argv), capture_output=True, start_new_session=True
    )


def test_the_command_runs_in_the_sandbox_with_its_status(helper: str, holder: int) -> None:
    script = "pwd; hostname; ls /workspace >/dev/null; echo err >&2; exit 3"
    done = _enter(helper, holder, "/workspace", ["sh", "-c", script])
    assert done.returncode == 3 and done.stdout.startswith(b"/workspace\n")
    assert done.stderr == b"err\n"
    # Its own pid namespace: the command is a low pid there, not the host's.
    done = _enter(helper, holder, "/", ["sh", "-c", "echo $$"])
    assert int(done.stdout) < 100


def test_exit_by_signal_is_reported_as_that_signal(helper: str, holder: int) -> None:
    assert _enter(helper, holder, "/", ["sh", "-c", "kill -KILL $$"]).returncode == -signal.SIGKILL


def _status(helper: str, holder: int) -> dict[str, str]:
    done = _enter(helper, holder, "/", ["cat", "/proc/self/status"])
    assert done.returncode == 0, done.stderr
    return dict(line.split(":\t", 1) for line in done.stdout.decode().splitlines() if ":\t" in line)


def test_commands_keep_only_a_containers_capabilities_with_seccomp(
    helper: str, holder: int
) -> None:
    status = _status(helper, holder)
    kept = 0x800405FB  # chown dac_override fowner fsetid kill setgid setuid setpcap
    # net_bind_service sys_chroot setfcap: Docker's default less mknod, net_raw, audit_write
    assert int(status["CapEff"], 16) == kept and int(status["CapBnd"], 16) == kept
    assert status["CapAmb"].strip() == "0000000000000000"
    assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2"
    refused = _enter(helper, holder, "/", ["sh", "-c", "unshare -U true || mknod /tmp/d b 8 0"])
    assert refused.returncode != 0 and b"Operation not permitted" in refused.stderr


def test_the_seccomp_program_is_printed_whole(helper: str) -> None:
    bpf = subprocess.run([helper, "--seccomp-bpf"], capture_output=True, check=True).stdout
    assert bpf and len(bpf) % 8 == 0  # struct sock_filter: 8 bytes an instruction


def test_a_holder_without_a_user_namespace_is_refused(helper: str, tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        done = subprocess.run(
            enter.enter_argv(helper, sleeper.pid, "/", [], ["true"]), capture_output=True
        )
        assert done.returncode == 125 and b"no user namespace of its own" in done.stderr
    finally:
        sleeper.kill()
        sleeper.wait()


def test_missing_command_and_bad_cwd(helper: str, holder: int) -> None:
    new = _enter(helper, holder, "/", ["no-such-binary-here"])
    assert new.returncode == 127 and b"no-such-binary-here" in new.stderr
    new = subprocess.run(
        enter.enter_argv(helper, holder, "/no/such/dir", [], ["true"]), capture_output=True
    )
    assert new.returncode == 125 and b"/no/such/dir" in new.stderr


def test_a_cgroup_it_cannot_join_stops_the_command(
    helper: str, holder: int, tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-cgroup" / "cgroup.procs")
    done = subprocess.run(
        enter.enter_argv(helper, holder, "/", [missing], ["touch", "/workspace/ran"]),
        capture_output=True,
    )
    assert done.returncode == 125 and b"cannot join the sandbox cgroup" in done.stderr
    assert not (tmp_path / "ws" / "ran").exists()


def test_joins_the_cgroup_before_running(helper: str, holder: int, tmp_path: Path) -> None:
    # A plain file stands in for cgroup.procs: the helper writes its pid there first.
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    done = subprocess.run(
        enter.enter_argv(helper, holder, "/", [str(procs)], ["true"]), capture_output=True
    )
    assert done.returncode == 0, done.stderr
    assert procs.read_text().strip().isdigit()


def test_malformed_arguments_are_refused(helper: str) -> None:
    done = subprocess.run([helper, "1", "/", "2", "only-one", "--", "true"], capture_output=True)
    assert done.returncode == 125 and b"malformed" in done.stderr

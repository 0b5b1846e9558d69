"""orchard-enter, the compiled sandbox entry, behaves as the ``sh`` + ``nsenter`` it replaces."""

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
from orchard_env_agent.process import in_cgroups
from orchard_env_agent.runner import nsenter_prefix

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


def _both(
    helper: str, holder: int, cwd: str, argv: list[str]
) -> tuple[subprocess.CompletedProcess[bytes], subprocess.CompletedProcess[bytes]]:
    """The same command through the helper and through sh + nsenter."""
    via_helper = subprocess.run(enter.enter_argv(helper, holder, cwd, [], argv),
                                capture_output=True, start_new_session=True)  # fmt: skip
    old = in_cgroups(nsenter_prefix(holder, cwd) + argv, [])
    via_nsenter = subprocess.run(old, capture_output=True, start_new_session=True)
    return via_helper, via_nsenter


def test_same_outcome_as_nsenter(helper: str, holder: int) -> None:
    script = "pwd; hostname; ls /workspace >/dev/null; echo err >&2; exit 3"
    new, old = _both(helper, holder, "/workspace", ["sh", "-c", script])
    assert (new.returncode, new.stdout, new.stderr) == (old.returncode, old.stdout, old.stderr)
    assert new.returncode == 3 and new.stdout.startswith(b"/workspace\n")
    # Its own pid namespace: the command is a low pid there, not the host's.
    new, _ = _both(helper, holder, "/", ["sh", "-c", "echo $$"])
    assert int(new.stdout) < 100


def test_exit_by_signal_is_reported_as_that_signal(helper: str, holder: int) -> None:
    new, old = _both(helper, holder, "/", ["sh", "-c", "kill -KILL $$"])
    assert new.returncode == old.returncode == -signal.SIGKILL


def test_missing_command_and_bad_cwd(helper: str, holder: int) -> None:
    new, _ = _both(helper, holder, "/", ["no-such-binary-here"])
    assert new.returncode == 127 and b"no-such-binary-here" in new.stderr
    new = subprocess.run(enter.enter_argv(helper, holder, "/no/such/dir", [], ["true"]),
                         capture_output=True)  # fmt: skip
    assert new.returncode == 125 and b"/no/such/dir" in new.stderr


def test_a_cgroup_it_cannot_join_stops_the_command(helper: str, holder: int, tmp_path: Path) -> None:  # fmt: skip
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
    done = subprocess.run(enter.enter_argv(helper, holder, "/", [str(procs)], ["true"]),
                          capture_output=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert procs.read_text().strip().isdigit()


def test_malformed_arguments_are_refused(helper: str) -> None:
    done = subprocess.run([helper, "1", "/", "2", "only-one", "--", "true"], capture_output=True)
    assert done.returncode == 125 and b"malformed" in done.stderr

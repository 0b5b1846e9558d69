"""Killing and reaping host processes by pid (real child processes, no sandbox)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from orchard_env_server.backends.local.processes import is_alive, kill_and_wait, start_time


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] == b"Z"


def _unreaped(argv: list[str]) -> int:
    """A child of this process that nobody else will wait for (as holders' monitors are)."""
    proc = subprocess.Popen(argv)
    proc.returncode = 0  # Popen must not reap it behind the test's back
    return proc.pid


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_a_running_child_is_killed_and_reaped():
    pid = _unreaped(["sleep", "60"])
    started = start_time(pid)
    assert is_alive(pid, started)
    kill_and_wait(pid, started)
    assert _gone(pid) and not _is_zombie(pid)


def test_a_child_that_already_exited_is_reaped_not_left_a_zombie():
    pid = _unreaped(["true"])
    started = None
    deadline = time.monotonic() + 5
    while not _is_zombie(pid):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    kill_and_wait(pid, started)
    assert _gone(pid)


@pytest.mark.parametrize("delay", ["0", "0.001", "0.005", "0.02"])
def test_a_child_exiting_on_its_own_while_being_killed_is_reaped(delay):
    """The race that once left a bwrap monitor a zombie: it exits between two looks."""
    for _ in range(20):
        pid = _unreaped([sys.executable, "-S", "-c", f"import time; time.sleep({delay})"])
        kill_and_wait(pid, start_time(pid))
        assert _gone(pid) and not _is_zombie(pid)


def test_a_pid_now_naming_another_process_is_left_alone():
    pid = _unreaped(["sleep", "60"])
    started = start_time(pid)
    assert started is not None
    try:
        kill_and_wait(pid, started + 1, timeout=0.2)
        assert is_alive(pid, started)
    finally:
        kill_and_wait(pid, started)
    assert _gone(pid)

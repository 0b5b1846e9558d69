"""Facts about host processes, read from /proc, so adopted pids can be trusted."""

from __future__ import annotations

import contextlib
import os
import signal
import time


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks, or None when it is gone or a zombie.

    A pid alone can be reused; pid plus start time names one process for good.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def is_alive(pid: int | None, started: int | None) -> bool:
    return pid is not None and started is not None and start_time(pid) == started


def kill(pid: int | None, started: int | None) -> None:
    """SIGKILL one process if it is still the one we started; do not wait for it."""
    if pid is not None and start_time(pid) == started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def kill_and_wait(pid: int, started: int | None, timeout: float = 5.0) -> None:
    """SIGKILL one process (if it is still the one we started) and wait until it is gone.

    A child of ours is gone once reaped: it stays a zombie until then (holders' bwrap
    monitors usually exit on their own once the sandbox's pid 1 is killed, and must still
    be waited for). Another process's child (adopted after a restart) is gone once it
    is a zombie: its parent reaps it, not us."""
    current = start_time(pid)
    if current is not None:
        if started is not None and current != started:
            return  # the pid belongs to another process now
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while True:
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child (or reaped already)
            if start_time(pid) is None:
                return
        else:
            if reaped:
                return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.005)


def holders_named(hostname: str) -> list[int]:
    """The bubblewrap processes (a holder and its monitor) started with ``--hostname
    HOSTNAME``: how the holder of a sandbox whose record was never written (its server
    killed mid-create) is found again."""
    wanted = os.fsencode(hostname)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if os.path.basename(argv[0]) != b"bwrap" or b"--hostname" not in argv:
            continue
        at = argv.index(b"--hostname")
        if at + 1 < len(argv) and argv[at + 1] == wanted:
            found.append(int(entry))
    return found

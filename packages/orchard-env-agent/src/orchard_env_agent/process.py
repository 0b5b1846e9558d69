"""Spawning commands and waiting for them with rusage, off asyncio's child watcher.

Each child gets a pidfd watched by the loop; when it becomes readable the child is reaped
with ``wait4`` (which gives rusage). When the agent is PID 1 it also reaps orphans on
SIGCHLD, peeking with ``WNOWAIT`` so that tracked children keep their status for us.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Protocol


@dataclass
class ExitInfo:
    returncode: int | None  # None when killed by a signal, or when it is unknown
    signal: int | None
    usage: dict[str, float | int]
    # Why the exit status is unknown (the command's spawner died under it), if it is.
    error: str | None = None


def exit_info(status: int, user_s: float, system_s: float, max_rss_kb: int) -> ExitInfo:
    """How a process ended, from its wait status and its resource usage."""
    usage: dict[str, float | int] = {
        "cpu_user_s": round(user_s, 6),
        "cpu_system_s": round(system_s, 6),
        "max_rss_bytes": int(max_rss_kb) * 1024,
    }
    if os.WIFSIGNALED(status):
        return ExitInfo(None, os.WTERMSIG(status), usage)
    return ExitInfo(os.waitstatus_to_exitcode(status), None, usage)


def _exit_info(status: int, ru: resource.struct_rusage) -> ExitInfo:
    return exit_info(status, ru.ru_utime, ru.ru_stime, int(ru.ru_maxrss))


class Reaper:
    """Tracks our children; reaps them (and, as PID 1, orphans) with wait4."""

    def __init__(self) -> None:
        self._tracked: dict[int, Callable[[ExitInfo], None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        if os.getpid() == 1:
            loop.add_signal_handler(signal.SIGCHLD, self._reap_all)

    def track(self, pid: int, callback: Callable[[ExitInfo], None]) -> None:
        loop = self._loop or asyncio.get_running_loop()
        self._tracked[pid] = callback
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # already gone and reaped elsewhere? poll it once
            loop.call_soon(self._try_reap, pid)
            return

        def on_ready() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._try_reap(pid)

        loop.add_reader(pidfd, on_ready)

    def _try_reap(self, pid: int) -> None:
        if pid not in self._tracked:
            return
        try:
            got, status, ru = os.wait4(pid, os.WNOHANG)
        except ChildProcessError:
            got, status, ru = pid, 0, resource.getrusage(resource.RUSAGE_SELF)
            status = 255 << 8
        if got == 0:  # spurious wake-up; the pidfd fired before it is waitable
            assert self._loop is not None
            self._loop.call_later(0.001, self._try_reap, pid)
            return
        callback = self._tracked.pop(pid)
        callback(_exit_info(status, ru))

    def _reap_all(self) -> None:
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            pid = info.si_pid
            if pid in self._tracked:
                self._try_reap(pid)
            else:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)


REAPER = Reaper()


def join_cgroups(procs_files: Sequence[str]) -> Callable[[], None] | None:
    """A ``preexec_fn`` moving the child into the given cgroups; None when there are none.

    It runs between fork and exec, so it uses plain system calls only; a failure aborts
    the spawn (Popen raises). Costly (Popen must fork, not vfork, and the child touches
    the parent's pages): for paths that need a ``preexec_fn`` anyway (the PTY).
    """
    if not procs_files:
        return None
    paths = [os.fsencode(p) for p in procs_files]

    def join() -> None:
        pid = str(os.getpid()).encode()
        for path in paths:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    return join


# Moves the shell into each cgroup, then becomes the command: one small exec of /bin/sh
# (~1 ms) instead of a preexec_fn, which costs a full fork of the agent (~5 ms).
_JOIN_SCRIPT = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do '
    'echo $$ > "$1" || { echo "orchard: cannot join the sandbox cgroup $1" >&2; exit 125; }; '
    'shift; n=$((n - 1)); done; exec "$@"'
)


def in_cgroups(argv: Sequence[str], procs_files: Sequence[str]) -> list[str]:
    """``argv`` run so that it starts inside the given cgroups (unchanged when none)."""
    if not procs_files:
        return list(argv)
    return [
        "/bin/sh",
        "-c",
        _JOIN_SCRIPT,
        "orchard-join",
        str(len(procs_files)),
        *procs_files,
        *argv,
    ]


class Running(Protocol):
    """A started command, however it was started."""

    exited: asyncio.Future[ExitInfo]

    def kill_group(self) -> None:
        """SIGKILL the command's process group."""


@dataclass
class Spawned:
    pid: int
    popen: subprocess.Popen[bytes]
    exited: asyncio.Future[ExitInfo]
    closed: list[int] = field(default_factory=list)

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)


def take_fd(pipe: IO[bytes]) -> int:
    """The pipe's fd as a plain one of ours; the file object is closed."""
    fd = os.dup(pipe.fileno())
    pipe.close()
    return fd


class OutputReaders:
    """A child's stdout and stderr pipes (their read ends, which this owns and closes),
    read without blocking on the loop into callbacks."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        pipes: Sequence[tuple[int, Callable[[bytes], None]]],
    ) -> None:
        self.loop = loop
        self.readers: list[tuple[int, Callable[[bytes], None]]] = []
        for fd, cb in pipes:
            os.set_blocking(fd, False)
            self.readers.append((fd, cb))
        self.open_fds = {fd for fd, _ in self.readers}
        for fd, cb in self.readers:
            loop.add_reader(fd, self.drain, fd, cb)

    def close(self, fd: int) -> None:
        if fd in self.open_fds:
            self.open_fds.discard(fd)
            self.loop.remove_reader(fd)
            os.close(fd)

    def drain(self, fd: int, cb: Callable[[bytes], None]) -> None:
        while fd in self.open_fds:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.close(fd)
                return
            cb(data)
            if len(data) < 65536:
                return

    def read_to_end(self) -> None:
        """After the exit: output written before it is already in the pipes, so read it
        all now. Pipes still held open by background children are closed (their later
        output is lost)."""
        for fd, cb in self.readers:
            while fd in self.open_fds:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # BlockingIOError included: nothing more right now
                    data = b""
                if data:
                    cb(data)
                else:
                    self.close(fd)


def feed_stdin(
    loop: asyncio.AbstractEventLoop,
    wfd: int,
    stdin: bytes,
    exited: asyncio.Future[ExitInfo],
) -> None:
    """Write ``stdin`` to the child's stdin pipe (its write end, which this owns) without
    blocking the loop; closed when all is written, the child closes its end, or it exits."""
    os.set_blocking(wfd, False)
    pending = memoryview(stdin)
    state = {"open": True}

    def close_writer() -> None:
        if state["open"]:
            state["open"] = False
            loop.remove_writer(wfd)
            os.close(wfd)

    def pump() -> None:
        nonlocal pending
        try:
            while pending:
                n = os.write(wfd, pending)
                pending = pending[n:]
        except BlockingIOError:
            return
        except OSError:  # EPIPE: the child closed its stdin
            pass
        close_writer()

    loop.add_writer(wfd, pump)
    pump()
    exited.add_done_callback(lambda _: close_writer())


def spawn(
    argv: Sequence[str],
    *,
    cwd: str | None,
    env: dict[str, str],
    stdin: bytes | None,
    on_stdout: Callable[[bytes], None],
    on_stderr: Callable[[bytes], None],
    cgroup_procs: Sequence[str] = (),
) -> Spawned:
    """Start argv in its own session; output goes to the callbacks, EOF flushes them.

    With ``cgroup_procs`` the child moves itself into those cgroups before it executes
    ``argv`` (so everything it forks is limited from the first instruction on).
    Raises FileNotFoundError / PermissionError / OSError from exec as Popen does.
    """
    loop = asyncio.get_running_loop()
    popen = subprocess.Popen(
        in_cgroups(argv, cgroup_procs),
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
    )
    exited: asyncio.Future[ExitInfo] = loop.create_future()
    proc = Spawned(popen.pid, popen, exited)
    assert popen.stdout is not None and popen.stderr is not None
    readers = OutputReaders(
        loop, ((take_fd(popen.stdout), on_stdout), (take_fd(popen.stderr), on_stderr))
    )
    if stdin:
        assert popen.stdin is not None
        feed_stdin(loop, take_fd(popen.stdin), stdin, exited)

    def on_exit(info: ExitInfo) -> None:
        popen.returncode = info.returncode if info.returncode is not None else -1
        readers.read_to_end()
        if not exited.done():
            exited.set_result(info)

    REAPER.track(popen.pid, on_exit)
    return proc

"""A local sandbox's command spawner: one ``orchard-enter --serve`` process inside it.

Started when the sandbox is registered, the spawner forks every command from inside the
sandbox (see orchard_enter.c): the agent neither forks itself nor has the helper enter
the namespaces again per command. The agent talks to it over a SOCK_SEQPACKET socket
pair, one message per request with the command's pipes passed as fds, and reads the
replies on its loop. If the spawner dies, the commands it was running fail with an error
saying so (their output is kept; their exit status is lost) and the next command starts
a new spawner. A request that does not fit in one message, or finds the socket full, is
not sent: the caller starts that command the one-shot way instead.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import itertools
import logging
import os
import signal
import socket
import struct
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from . import enter
from .process import REAPER, ExitInfo, OutputReaders, exit_info, feed_stdin

if TYPE_CHECKING:
    from .context import SandboxContext

log = logging.getLogger("orchard_env_agent.spawner")

# The wire format of orchard_enter.c's --serve (host byte order).
_REQUEST = struct.Struct("=IIIIII")  # op, id, flags, argc, envc, reserved
_REPLY = struct.Struct("=IIiiqqq")  # kind, id, pid, status, user_us, system_us, max_rss_kb
_OP_SPAWN, _OP_KILL = 1, 2
_STARTED, _EXITED, _FAILED = 1, 2, 3
_WITH_STDIN = 1
MAX_REQUEST = 256 * 1024  # the spawner's receive buffer


class RemoteCommand:
    """A command a spawner started: its exit arrives as a reply."""

    def __init__(self, spawner: Spawner, ident: int, exited: asyncio.Future[ExitInfo]) -> None:
        self.exited = exited
        self._spawner = spawner
        self._ident = ident

    def kill_group(self) -> None:
        """SIGKILL the command's process group (the spawner does it while the command's
        leader is unreaped, so the group cannot be another's)."""
        self._spawner.kill(self._ident)


class _Pending:
    def __init__(self, command: RemoteCommand, readers: OutputReaders) -> None:
        self.command = command
        self.readers = readers

    def settle(self, info: ExitInfo) -> None:
        self.readers.read_to_end()
        if not self.command.exited.done():
            self.command.exited.set_result(info)


def _request_payload(
    cwd: str, argv: Sequence[str], env: Mapping[str, str]
) -> tuple[bytes, int, int]:
    """CWD, ARGV and ENV as NUL-terminated strings; ValueError as Popen would raise it."""
    for name in env:
        if "=" in name:
            raise ValueError(f"illegal environment variable name: {name!r}")
    items = [f"{name}={value}" for name, value in env.items()]
    strings = [cwd, *argv, *items]
    if any("\0" in s for s in strings):
        raise ValueError("embedded null byte")
    return b"".join(os.fsencode(s) + b"\0" for s in strings), len(argv), len(items)


class Spawner:
    """The spawner process of one sandbox and the commands it is running."""

    def __init__(self, sock: socket.socket, popen: subprocess.Popen[bytes]) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock = sock
        self._popen = popen
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._kills: collections.deque[bytes] = collections.deque()
        self.alive = True
        sock.setblocking(False)
        self._loop.add_reader(sock.fileno(), self._on_readable)
        REAPER.track(popen.pid, self._on_exit)

    @classmethod
    def start(cls, helper: str, ctx: SandboxContext) -> Spawner:
        """Start the sandbox's spawner (it enters the sandbox while the first request waits
        in its socket). Raises ``OSError`` when it cannot be started."""
        assert ctx.holder_pid is not None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            argv = enter.serve_argv(
                helper, ctx.holder_pid, ctx.cgroup_procs, theirs.fileno(), user=ctx.user
            )
            popen = subprocess.Popen(
                argv,
                env={},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        assert popen.stderr is not None
        os.set_blocking(popen.stderr.fileno(), False)
        return cls(ours, popen)

    @property
    def pid(self) -> int:
        """The spawner process's host pid."""
        return self._popen.pid

    def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        on_stdout: Callable[[bytes], None],
        on_stderr: Callable[[bytes], None],
    ) -> RemoteCommand | None:
        """Ask the spawner to start ``argv``; None when the request cannot be sent (too
        big, the socket full, the spawner gone): start it another way."""
        if not self.alive:
            return None
        payload, argc, envc = _request_payload(cwd, argv, env)
        if _REQUEST.size + len(payload) > MAX_REQUEST:
            return None
        ident = next(self._ids) & 0xFFFFFFFF
        header = _REQUEST.pack(_OP_SPAWN, ident, _WITH_STDIN if stdin else 0, argc, envc, 0)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        theirs, ours = [out_w, err_w], [out_r, err_r]
        if stdin:
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
            theirs.append(in_r)
            ours.append(in_w)
        try:
            socket.send_fds(self._sock, [header, payload], theirs)
        except OSError as exc:
            for fd in ours:
                os.close(fd)
            if not isinstance(exc, BlockingIOError):
                log.info("spawner of pid %s refused a request: %s", self._popen.pid, exc)
            return None
        finally:
            for fd in theirs:
                os.close(fd)
        exited: asyncio.Future[ExitInfo] = self._loop.create_future()
        command = RemoteCommand(self, ident, exited)
        readers = OutputReaders(self._loop, ((out_r, on_stdout), (err_r, on_stderr)))
        if stdin:
            feed_stdin(self._loop, ours[2], stdin, exited)
        self._pending[ident] = _Pending(command, readers)
        return command

    def kill(self, ident: int) -> None:
        if self.alive and ident in self._pending:
            queued = bool(self._kills)  # then the socket is full and a writer waits for it
            self._kills.append(_REQUEST.pack(_OP_KILL, ident, signal.SIGKILL, 0, 0, 0))
            if not queued:
                self._send_kills()

    def _send_kills(self) -> None:
        """Send the queued kill requests; a full socket keeps the rest, with a writer that
        sends them once it drains (a kill is never dropped the way a spawn request may be).
        The writer is registered exactly while kills are queued."""
        while self._kills:
            try:
                self._sock.send(self._kills[0])
            except BlockingIOError:
                self._loop.add_writer(self._sock.fileno(), self._send_kills)
                return
            except OSError:
                self._kills.clear()  # the spawner is gone: its EOF fails the commands
                break
            self._kills.popleft()
        self._loop.remove_writer(self._sock.fileno())

    def close(self) -> None:
        """Close the socket: the spawner exits (commands it started go on until they end
        or the sandbox is removed); commands still waiting for an exit fail."""
        self._stop("the sandbox's command spawner was closed (the sandbox is being removed)")

    def _on_readable(self) -> None:
        while self.alive:
            try:
                data = self._sock.recv(_REPLY.size)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._stop(self._death_note())
                return
            if len(data) == _REPLY.size:
                self._on_reply(*_REPLY.unpack(data))

    def _on_reply(
        self, kind: int, ident: int, pid: int, status: int, user_us: int, sys_us: int, rss: int
    ) -> None:
        pending = self._pending.get(ident)
        if pending is None or kind == _STARTED:  # started: nothing to do until it ends
            return
        if kind == _EXITED:
            del self._pending[ident]
            pending.settle(exit_info(status, user_us / 1e6, sys_us / 1e6, rss))
        elif kind == _FAILED:
            del self._pending[ident]
            reason = "the request was refused" if status == errno.EINVAL else os.strerror(status)
            pending.settle(ExitInfo(None, None, {}, f"could not start the command: {reason}"))

    def _death_note(self) -> str:
        detail = ""
        assert self._popen.stderr is not None
        with contextlib.suppress(OSError, TypeError):  # TypeError: read() found nothing yet
            detail = (self._popen.stderr.read(4096) or b"").decode(errors="replace").strip()
        return "the sandbox's command spawner exited" + (f" ({detail})" if detail else "")

    def _stop(self, reason: str) -> None:
        if not self.alive:
            return
        self.alive = False
        self._loop.remove_reader(self._sock.fileno())
        if self._kills:
            self._loop.remove_writer(self._sock.fileno())
            self._kills.clear()
        self._sock.close()
        assert self._popen.stderr is not None
        self._popen.stderr.close()
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            entry.settle(ExitInfo(None, None, {}, f"{reason}; the command's exit status is lost"))

    def _on_exit(self, info: ExitInfo) -> None:
        self._popen.returncode = info.returncode if info.returncode is not None else -1
        if self.alive:  # its socket's EOF may not have been read yet
            self._loop.call_soon(self._on_readable)


def spawner_for(ctx: SandboxContext) -> Spawner | None:
    """The sandbox's running spawner, started if it has none or it died; None when none
    can run (no helper, or it could not start): the caller falls back to one-shot starts."""
    current = ctx.spawner
    if current is not None and current.alive:
        return current
    if ctx.holder_pid is None:
        return None
    helper = enter.helper()
    if helper is None:
        return None
    try:
        ctx.spawner = Spawner.start(helper, ctx)
    except OSError as exc:
        log.warning("could not start the spawner of sandbox %s: %s", ctx.sandbox_id, exc)
        return None
    return ctx.spawner

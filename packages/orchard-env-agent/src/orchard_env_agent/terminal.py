"""A command on a new pseudo-terminal inside a sandbox, driven by either PTY protocol."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import pty as _pty
import signal
import struct
import subprocess
import termios
from collections.abc import Callable

from . import enter
from .context import DEFAULT_PATH, SandboxContext
from .process import REAPER, ExitInfo, join_cgroups
from .runner import NO_HELPER


class StartError(Exception):
    """The command could not be started; ``exit_code`` 127 (not found) or 126 (not executable)
    when the shell would have answered so, else None."""

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def window(value: object, default: int) -> int:
    """A window dimension from a client: an int in 1..10000, else ``default``."""
    try:
        number = int(value) if isinstance(value, (int, float, str)) and value != "" else default
    except ValueError:
        return default
    return max(1, min(number, 10000))


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _child_setup(cgroup_procs: list[str]) -> Callable[[], None]:
    join = join_cgroups(cgroup_procs)

    def setup() -> None:  # runs in the child, after setsid()
        if join is not None:
            join()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    return setup


def terminal_env(ctx: SandboxContext, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(ctx.env)
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("TERM", "xterm-256color")
    env.update(extra or {})
    return env


def is_sandbox_dir(ctx: SandboxContext, path: str) -> bool:
    """Whether ``path`` (absolute, as the sandbox sees it) is a directory there."""
    probe = f"/proc/{ctx.holder_pid}/root{path}" if ctx.holder_pid is not None else path
    return os.path.isdir(probe)


class Terminal:
    """A started command: its PTY's output as a queue (``None`` at EOF) and its exit."""

    def __init__(self, proc: subprocess.Popen[bytes], master: int) -> None:
        self.proc = proc
        self.pid = proc.pid
        self._master = master
        self._loop = asyncio.get_running_loop()
        self.output: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.exited: asyncio.Future[ExitInfo] = self._loop.create_future()
        self._reading = True
        self._closed = False
        REAPER.track(proc.pid, self._on_exit)
        os.set_blocking(master, False)
        self._loop.add_reader(master, self._on_readable)

    @classmethod
    def start(
        cls,
        ctx: SandboxContext,
        argv: list[str],
        *,
        cwd: str,
        env: dict[str, str],
        cols: int,
        rows: int,
    ) -> Terminal:
        """Start ``argv`` in the sandbox on a new PTY in its own session (StartError if not)."""
        popen_cwd: str | None = cwd
        cgroup_procs = ctx.cgroup_procs
        if ctx.holder_pid is not None:
            helper = enter.helper()
            if helper is None:
                raise StartError(NO_HELPER)
            argv = enter.enter_argv(helper, ctx.holder_pid, cwd, cgroup_procs, argv, user=ctx.user)
            popen_cwd, cgroup_procs = None, []  # the helper joins them
            env = enter.helper_env(env)
        master, slave = _pty.openpty()
        _set_size(master, cols, rows)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=popen_cwd,
                env=env,
                start_new_session=True,
                preexec_fn=_child_setup(cgroup_procs),
                close_fds=True,
            )
        except FileNotFoundError as exc:
            os.close(master)
            if popen_cwd is not None and exc.filename == popen_cwd:
                raise StartError(f"cannot change to {cwd}: {exc.strerror}") from exc
            raise StartError(f"{argv[0]}: command not found", 127) from exc
        except PermissionError as exc:
            os.close(master)
            raise StartError(f"{argv[0]}: permission denied", 126) from exc
        except (OSError, subprocess.SubprocessError) as exc:
            os.close(master)
            raise StartError(f"cannot start {argv[0]}: {exc}") from exc
        finally:
            os.close(slave)
        return cls(proc, master)

    def _on_exit(self, info: ExitInfo) -> None:
        self.proc.returncode = info.returncode if info.returncode is not None else -1
        if not self.exited.done():
            self.exited.set_result(info)

    def _on_readable(self) -> None:
        try:
            data = os.read(self._master, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: every slave fd is closed
            data = b""
        if data:
            self.output.put_nowait(data)
        else:
            self._stop_reading()
            self.output.put_nowait(None)

    def _stop_reading(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._master)
            self._reading = False

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self._closed:
            try:
                n = os.write(self._master, view)
                view = view[n:]
            except BlockingIOError:
                await asyncio.sleep(0.005)
            except OSError:  # EIO: the terminal is gone
                return

    def resize(self, cols: int, rows: int) -> None:
        if self._closed:
            return
        _set_size(self._master, cols, rows)
        self.signal(signal.SIGWINCH)

    def signal(self, sig: int) -> None:
        """Signal the command's process group (its session)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def close(self) -> None:
        """Kill what is left of the process group and release the PTY (idempotent)."""
        if self._closed:
            return
        self.signal(signal.SIGKILL)
        self._stop_reading()
        os.close(self._master)
        self._closed = True

    async def exit_info(self, timeout: float) -> ExitInfo | None:
        """How the command ended, waiting up to ``timeout`` seconds for it."""
        with contextlib.suppress(asyncio.TimeoutError):
            return await asyncio.wait_for(asyncio.shield(self.exited), timeout)
        return None

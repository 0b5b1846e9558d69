"""WS /exec/pty: an interactive terminal relayed over a WebSocket (binary frames)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty as _pty
import shlex
import signal
import struct
import subprocess
import termios
from collections.abc import Callable

from starlette.websockets import WebSocket, WebSocketDisconnect

from . import enter
from .context import DEFAULT_PATH, SandboxContext
from .process import REAPER, ExitInfo, join_cgroups
from .runner import NO_HELPER


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _child_setup(cgroup_procs: list[str]) -> Callable[[], None]:
    join = join_cgroups(cgroup_procs)

    def setup() -> None:  # runs in the child, after setsid()
        if join is not None:
            join()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    return setup


def _int(value: str | None, default: int) -> int:
    try:
        return max(1, min(int(value or default), 10000))
    except ValueError:
        return default


async def run_pty(ctx: SandboxContext, ws: WebSocket) -> None:
    q = ws.query_params
    command = q.get("command")
    cols, rows = _int(q.get("cols"), 80), _int(q.get("rows"), 24)
    shell = "bash" if ctx.has_bash else "sh"
    argv = [shell, "-c", command] if command else [shell, "-l"]
    cwd = q.get("cwd") or ctx.workdir or "/"
    env = dict(ctx.env)
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("TERM", "xterm-256color")
    popen_cwd: str | None = cwd
    cgroup_procs = ctx.cgroup_procs
    if ctx.holder_pid is not None:
        helper = enter.helper()
        if helper is None:
            await ws.accept()
            await ws.send_bytes(f"{NO_HELPER}\r\n".encode())
            await ws.close(code=1011)
            return
        argv = enter.enter_argv(helper, ctx.holder_pid, cwd, cgroup_procs, argv)
        popen_cwd, cgroup_procs = None, []  # the helper joins them
    master, slave = _pty.openpty()
    _set_size(master, cols, rows)
    await ws.accept()
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
    except (OSError, subprocess.SubprocessError) as exc:
        os.close(master)
        os.close(slave)
        await ws.send_bytes(f"cannot start {shlex.join(argv)}: {exc}\r\n".encode())
        await ws.close(code=1011)
        return
    os.close(slave)
    os.set_blocking(master, False)
    loop = asyncio.get_running_loop()
    out: asyncio.Queue[bytes | None] = asyncio.Queue()
    exited: asyncio.Future[ExitInfo] = loop.create_future()

    def on_exit(info: ExitInfo) -> None:
        proc.returncode = info.returncode if info.returncode is not None else -1
        if not exited.done():
            exited.set_result(info)

    REAPER.track(proc.pid, on_exit)
    reading = True

    def on_readable() -> None:
        nonlocal reading
        try:
            data = os.read(master, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: every slave fd is closed
            data = b""
        if data:
            out.put_nowait(data)
        else:
            loop.remove_reader(master)
            reading = False
            out.put_nowait(None)

    loop.add_reader(master, on_readable)

    async def pump_out() -> None:
        while True:
            data = await out.get()
            if data is None:
                return
            await ws.send_bytes(data)

    async def write_master(data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(master, view)
                view = view[n:]
            except BlockingIOError:
                await asyncio.sleep(0.005)

    async def pump_in() -> None:
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            if msg.get("bytes") is not None:
                await write_master(msg["bytes"])
            elif msg.get("text") is not None:
                text = msg["text"]
                try:
                    obj = json.loads(text)
                except ValueError:
                    obj = None
                if isinstance(obj, dict) and obj.get("type") == "resize":
                    _set_size(
                        master, _int(str(obj.get("cols")), cols), _int(str(obj.get("rows")), rows)
                    )
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGWINCH)
                else:
                    await write_master(text.encode())

    out_task = asyncio.ensure_future(pump_out())
    in_task = asyncio.ensure_future(pump_in())
    try:
        await asyncio.wait({out_task, in_task}, return_when=asyncio.FIRST_COMPLETED)
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for t in (out_task, in_task):
            t.cancel()
        if reading:
            loop.remove_reader(master)
        os.close(master)
    code = None
    with contextlib.suppress(asyncio.TimeoutError):
        code = (await asyncio.wait_for(exited, 2)).returncode
    with contextlib.suppress(Exception):
        await ws.close(code=1000, reason=f"exit {code}")

"""The public Orchard Env SDK's terminal protocol: JSON text frames, data in base64.

Client to agent (the first frame is ``init``; it selects this protocol, see ``pty``):

- ``{"type": "init", "cmd": [...], "env": {...} | null, "cwd": "..." | null, "rows": 24,
  "cols": 80, "login_shell": false}``: ``cmd`` runs as given (an argv, no shell), with the
  sandbox's environment plus ``env``, in ``cwd`` (default: the sandbox's working directory;
  one that is not a directory there: ``/``). ``login_shell`` runs it through
  ``bash --login -i -c`` after sourcing ``~/.bashrc``.
- ``{"type": "stdin", "data": "<base64>"}``
- ``{"type": "resize", "rows": N, "cols": N}``
- ``{"type": "signal", "sig": "TERM"}``: to the command's process group; ``TERM``, ``KILL``,
  ``INT``, ``HUP``, ``QUIT`` (any other signal name, with or without ``SIG``, or number is
  accepted too; an unknown one is ``TERM``).
- ``{"type": "close"}``: SIGTERM to the group; later frames are ignored, the ``exit`` still
  comes (SIGKILL if the command is still there after CLOSE_GRACE_S).

Agent to client:

- ``{"type": "ready", "pid": N}`` once the command started (the pid as the agent sees it;
  ``null`` when the command was not found, which then prints why and exits 127 or 126).
- ``{"type": "stdout", "data": "<base64>"}``: the terminal's output (stdout and stderr).
- ``{"type": "exit", "code": N, "exit_code": N}`` when the command ended: its status,
  ``-N`` when killed by signal N. Output still pending is sent first (waiting at most
  DRAIN_S for processes that keep the terminal open); the socket then closes (1000).
- ``{"type": "error", "message": "..."}`` then a close: 4400 for a bad ``init``, 4500 when
  the command could not be started.

A client that goes away kills the command's process group.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import os
import shlex
import signal
from collections.abc import Mapping
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from .context import SandboxContext
from .process import ExitInfo
from .terminal import StartError, Terminal, is_sandbox_dir, terminal_env, window
from .validate import is_env

DRAIN_S = 1.0
CLOSE_GRACE_S = 5.0
_BASHRC = "if [ -f ~/.bashrc ]; then . ~/.bashrc; fi; "


def init_frame(message: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``init`` object when an ASGI WebSocket message is this protocol's first frame."""
    text = message.get("text")
    if text is None:
        return None
    try:
        frame = json.loads(text)
    except ValueError:
        return None
    return frame if isinstance(frame, dict) and frame.get("type") == "init" else None


def signal_number(name: object) -> int:
    """A signal from its name (``TERM``, ``SIGTERM``, any case) or number; else SIGTERM."""
    if isinstance(name, int) and not isinstance(name, bool):
        return name if name in signal.valid_signals() else signal.SIGTERM
    text = str(name).strip().upper()
    if text.isdigit():
        return signal_number(int(text))
    text = text if text.startswith("SIG") else "SIG" + text
    try:
        return int(signal.Signals[text])
    except KeyError:
        return signal.SIGTERM


class BadInit(ValueError):
    pass


def _argv(ctx: SandboxContext, init: dict[str, Any]) -> list[str]:
    cmd = init.get("cmd")
    if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) for c in cmd):
        raise BadInit("cmd must be a non-empty list of strings")
    if not init.get("login_shell"):
        return list(cmd)
    script = _BASHRC + shlex.join(cmd)
    return (
        ["bash", "--login", "-i", "-c", script]
        if ctx.has_bash
        else ["sh", "-l", "-i", "-c", script]
    )


def _env(init: dict[str, Any]) -> dict[str, str]:
    env = init.get("env") or {}
    if not is_env(env):
        raise BadInit("env must be an object of strings, names without '=' or NUL")
    return dict(env)


def _cwd(ctx: SandboxContext, init: dict[str, Any]) -> str:
    cwd = init.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise BadInit("cwd must be a string")
    base = ctx.workdir or "/"
    path = os.path.join(base, cwd) if cwd else base
    return path if is_sandbox_dir(ctx, path) else "/"


async def _send(ws: WebSocket, frame: dict[str, Any]) -> bool:
    try:
        await ws.send_text(json.dumps(frame))
        return True
    except (WebSocketDisconnect, RuntimeError, OSError):
        return False


async def _close(ws: WebSocket, code: int) -> None:
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        await ws.close(code=code)


def _code(info: ExitInfo | None) -> int:
    if info is None:
        return -1
    if info.returncode is not None:
        return info.returncode
    return -(info.signal or 0) or -1


async def _pump_out(ws: WebSocket, term: Terminal) -> None:
    while (data := await term.output.get()) is not None:
        if not await _send(ws, {"type": "stdout", "data": base64.b64encode(data).decode()}):
            return


async def _client(ws: WebSocket, term: Terminal, cols: int, rows: int) -> str:
    """Apply the client's frames; ``"close"`` or ``"gone"`` says how it ended."""
    while True:
        try:
            message = await ws.receive()
        except (WebSocketDisconnect, RuntimeError, OSError):
            return "gone"
        if message["type"] == "websocket.disconnect":
            return "gone"
        try:
            frame = json.loads(message.get("text") or "")
        except ValueError:
            continue  # binary frames and non-JSON text are not part of this protocol
        kind = frame.get("type") if isinstance(frame, dict) else None
        if kind == "stdin":
            try:
                data = base64.b64decode(str(frame.get("data") or ""), validate=True)
            except (binascii.Error, ValueError):
                continue
            await term.write(data)
        elif kind == "resize":
            cols, rows = window(frame.get("cols"), cols), window(frame.get("rows"), rows)
            term.resize(cols, rows)
        elif kind == "signal":
            term.signal(signal_number(frame.get("sig", "TERM")))
        elif kind == "close":
            term.signal(signal.SIGTERM)
            return "close"


async def run_json_pty(ctx: SandboxContext, ws: WebSocket, init: dict[str, Any]) -> None:
    """Serve one terminal session in this protocol; ``ws`` is accepted, ``init`` was read."""
    try:
        argv, env, cwd = _argv(ctx, init), _env(init), _cwd(ctx, init)
    except BadInit as exc:
        await _send(ws, {"type": "error", "message": f"bad init frame: {exc}"})
        await _close(ws, 4400)
        return
    cols, rows = window(init.get("cols"), 80), window(init.get("rows"), 24)
    try:
        term = Terminal.start(ctx, argv, cwd=cwd, env=terminal_env(ctx, env), cols=cols, rows=rows)
    except StartError as exc:
        if exc.exit_code is None:
            await _send(ws, {"type": "error", "message": f"spawn failed: {exc}"})
            await _close(ws, 4500)
            return
        await _send(ws, {"type": "ready", "pid": None})
        await _send(
            ws, {"type": "stdout", "data": base64.b64encode(f"{exc}\r\n".encode()).decode()}
        )
        await _send(ws, {"type": "exit", "code": exc.exit_code, "exit_code": exc.exit_code})
        await _close(ws, 1000)
        return
    out_task: asyncio.Task[None] | None = None
    in_task: asyncio.Task[str] | None = None
    try:
        if not await _send(ws, {"type": "ready", "pid": term.pid}):
            return
        out_task = asyncio.create_task(_pump_out(ws, term))
        in_task = asyncio.create_task(_client(ws, term, cols, rows))
        waiting: set[asyncio.Future[Any]] = {term.exited, in_task}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if not term.exited.done():
            if in_task.result() == "gone":
                return
            if await term.exit_info(CLOSE_GRACE_S) is None:
                term.signal(signal.SIGKILL)
        info = await term.exit_info(CLOSE_GRACE_S)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(out_task, DRAIN_S)  # cancelled (and waited for) on timeout
        if await _send(ws, {"type": "exit", "code": _code(info), "exit_code": _code(info)}):
            await _close(ws, 1000)
    finally:
        for task in (out_task, in_task):
            if task is not None:
                task.cancel()
        term.close()

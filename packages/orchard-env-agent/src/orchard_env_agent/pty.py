"""WS /exec/pty: an interactive terminal over a WebSocket, in one of two protocols.

Ours: the query names the command (``command``: run by the shell; none: a login shell),
``cwd``, ``cols`` and ``rows``; binary frames carry input and output both ways; a text
frame is a JSON ``{"type": "resize", "cols", "rows"}`` or else input; the socket closes
with the reason ``exit <code>``.

The public Orchard Env SDK's: JSON text frames, see ``pty_json``; its first frame is an
``init``.

The first client frame decides. A query naming any of our parameters is ours at once; else
the agent waits up to DECIDE_S for a first frame before it starts our shell (for a client
that waits for the prompt before typing), and an ``init`` that arrives later still switches
to the JSON protocol: the shell, which has seen no input, is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import MutableMapping
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from .context import SandboxContext
from .pty_json import init_frame, run_json_pty
from .terminal import StartError, Terminal, terminal_env, window

DECIDE_S = 0.5
_OUR_QUERY = ("command", "cwd", "cols", "rows")
_GONE = (WebSocketDisconnect, RuntimeError, OSError)

Message = MutableMapping[str, Any]


async def run_pty(ctx: SandboxContext, ws: WebSocket) -> None:
    await ws.accept()
    first: asyncio.Future[Message] = asyncio.ensure_future(ws.receive())
    try:
        ours = any(name in ws.query_params for name in _OUR_QUERY)
        if not ours:
            await asyncio.wait({first}, timeout=DECIDE_S)
        if first.done() and _message(first).get("type") == "websocket.disconnect":
            return
        init = init_frame(_message(first)) if first.done() and not ours else None
        if init is None:
            init = await _run_binary(ctx, ws, first, may_switch=not ours)
        if init is not None:
            await run_json_pty(ctx, ws, init)
    finally:
        first.cancel()


def _message(first: asyncio.Future[Message]) -> Message:
    """The first frame (done); a failed receive counts as a disconnect."""
    if first.cancelled() or first.exception() is not None:
        return {"type": "websocket.disconnect"}
    return first.result()


async def _run_binary(
    ctx: SandboxContext, ws: WebSocket, first: asyncio.Future[Message], *, may_switch: bool
) -> dict[str, Any] | None:
    """Our protocol; the ``init`` of a JSON client whose first frame came late, if so."""
    q = ws.query_params
    command = q.get("command")
    cols, rows = window(q.get("cols"), 80), window(q.get("rows"), 24)
    shell = "bash" if ctx.has_bash else "sh"
    argv = [shell, "-c", command] if command else [shell, "-l"]
    cwd = q.get("cwd") or ctx.workdir or "/"
    try:
        term = Terminal.start(ctx, argv, cwd=cwd, env=terminal_env(ctx), cols=cols, rows=rows)
    except StartError as exc:
        with contextlib.suppress(*_GONE):
            await ws.send_bytes(f"{exc}\r\n".encode())
            await ws.close(code=1011)
        return None
    late_init: dict[str, Any] | None = None

    async def pump_out() -> None:
        with contextlib.suppress(*_GONE):
            while (data := await term.output.get()) is not None:
                await ws.send_bytes(data)

    async def pump_in() -> None:
        nonlocal late_init
        with contextlib.suppress(*_GONE):
            message = await first
            if may_switch and (late_init := init_frame(message)) is not None:
                return
            while message["type"] != "websocket.disconnect":
                if message.get("bytes") is not None:
                    await term.write(message["bytes"])
                elif message.get("text") is not None:
                    await _text_frame(term, message["text"], cols, rows)
                message = await ws.receive()

    out_task = asyncio.ensure_future(pump_out())
    in_task = asyncio.ensure_future(pump_in())
    try:
        await asyncio.wait({out_task, in_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (out_task, in_task):
            task.cancel()
        term.close()
    if late_init is not None:
        return late_init
    info = await term.exit_info(2)
    code = info.returncode if info is not None else None
    with contextlib.suppress(*_GONE):
        await ws.close(code=1000, reason=f"exit {code}")
    return None


async def _text_frame(term: Terminal, text: str, cols: int, rows: int) -> None:
    """A JSON resize, or else input typed as text."""
    try:
        frame = json.loads(text)
    except ValueError:
        frame = None
    if isinstance(frame, dict) and frame.get("type") == "resize":
        term.resize(window(frame.get("cols"), cols), window(frame.get("rows"), rows))
    else:
        await term.write(text.encode())

"""Relaying frames between a Starlette WebSocket and a ``websockets`` client connection.

Used by the agent (to a WebSocket server inside the sandbox) and by the orchestrator (to
the agent), so both hops behave the same.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import websockets
from starlette.websockets import WebSocket, WebSocketDisconnect

# Close codes that mark the lack of a close frame: never sent in one.
_NOT_SENDABLE = {1005: 1000, 1006: 1011, 1015: 1011}


def _sendable(code: int | None) -> int:
    return 1000 if code is None else _NOT_SENDABLE.get(code, code)


async def relay(client: WebSocket, upstream: Any) -> None:
    """Pump frames both ways until either side closes, then close the other with the same
    code and reason (a terminal's ``exit <code>``, a protocol's error code)."""
    client_code: int | None = None

    async def client_to_upstream() -> None:
        nonlocal client_code
        with contextlib.suppress(WebSocketDisconnect, websockets.ConnectionClosed):
            while True:
                message = await client.receive()
                if message["type"] == "websocket.disconnect":
                    client_code = message.get("code")
                    return
                data = message.get("bytes")
                await upstream.send(data if data is not None else message.get("text", ""))

    async def upstream_to_client() -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for frame in upstream:
                if isinstance(frame, bytes):
                    await client.send_bytes(frame)
                else:
                    await client.send_text(frame)

    tasks = [asyncio.create_task(client_to_upstream()), asyncio.create_task(upstream_to_client())]
    _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await upstream.close(code=_sendable(client_code))
    with contextlib.suppress(Exception):
        await client.close(
            code=_sendable(upstream.close_code), reason=(upstream.close_reason or "")[:120]
        )


def requested_subprotocols(ws: WebSocket) -> list[str] | None:
    raw = ws.headers.get("sec-websocket-protocol")
    return [p.strip() for p in raw.split(",") if p.strip()] if raw else None

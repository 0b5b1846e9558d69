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


async def relay(client: WebSocket, upstream: Any) -> None:
    """Pump frames both ways until either side closes, then close the other."""

    async def client_to_upstream() -> None:
        with contextlib.suppress(WebSocketDisconnect, websockets.ConnectionClosed):
            while True:
                message = await client.receive()
                if message["type"] == "websocket.disconnect":
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
    await upstream.close()
    with contextlib.suppress(Exception):
        await client.close()


def requested_subprotocols(ws: WebSocket) -> list[str] | None:
    raw = ws.headers.get("sec-websocket-protocol")
    return [p.strip() for p in raw.split(",") if p.strip()] if raw else None

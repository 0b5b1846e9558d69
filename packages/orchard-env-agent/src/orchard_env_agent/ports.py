"""Forwarding HTTP requests to 127.0.0.1:PORT inside a sandbox."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import AsyncIterator

import anyio.to_thread
import h11
import websockets
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.websockets import WebSocket

from . import netns
from .context import SandboxContext
from .errors import ApiError
from .wsrelay import relay, requested_subprotocols

# Hop-by-hop headers (RFC 9110 7.6.1): never passed on by a relay.
RFC_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# What forwarding to a sandboxed port also drops: the orchestrator's credentials and
# sandbox selector, and what the next hop sets itself.
HOP_BY_HOP = RFC_HOP_BY_HOP | {"authorization", "x-orchard-sandbox", "host", "content-length"}


# What a path segment may carry unescaped (RFC 3986 pchar, minus "%": a literal "%" that
# arrived as %25 must leave as %25 again).
_SEGMENT_SAFE = "!$&'()*+,;=:@~"


def quote_path(path: str) -> str:
    """Re-encode a percent-decoded URL path for the next hop.

    Routers hand path parameters over decoded; sent on as they are, non-ASCII breaks the
    request line, a decoded ``?`` or ``#`` would start a query or fragment, and HTTP
    clients resolve ``.`` and ``..`` segments (a forwarded ``../../files`` would reach
    another endpoint). Each segment is escaped, dot segments included.
    """
    return "/".join(
        "%2E" * len(seg) if seg in (".", "..") else urllib.parse.quote(seg, safe=_SEGMENT_SAFE)
        for seg in path.split("/")
    )


async def forward(ctx: SandboxContext, request: Request, port: int, path: str) -> Response:
    if not 1 <= port <= 65535:
        raise ApiError(400, "invalid_port", f"port {port} is out of range")
    body = await request.body()
    try:
        sock = await anyio.to_thread.run_sync(netns.connect, port, ctx.holder_pid)
    except (ConnectionRefusedError, TimeoutError, OSError) as exc:
        raise ApiError(
            502, "port_not_listening", f"nothing listens on port {port} in the sandbox ({exc})"
        ) from None
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock)
    conn = h11.Connection(our_role=h11.CLIENT)
    target = "/" + quote_path(path) + (("?" + request.url.query) if request.url.query else "")
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
    headers += [("host", f"127.0.0.1:{port}"), ("connection", "close")]
    headers.append(("content-length", str(len(body))))
    try:
        writer.write(conn.send(h11.Request(method=request.method, target=target, headers=headers)))
        if body:
            writer.write(conn.send(h11.Data(data=body)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                break
            raise ApiError(502, "bad_upstream", "the sandbox service closed without an answer")
    except (h11.ProtocolError, OSError) as exc:
        writer.close()
        raise ApiError(502, "bad_upstream", f"bad answer from port {port}: {exc}") from None
    except BaseException:
        writer.close()
        raise

    out_headers = [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in event.headers
        if k.decode("latin-1").lower() not in HOP_BY_HOP - {"content-length"}
    ]

    async def body_iter() -> AsyncIterator[bytes]:
        try:
            while True:
                ev = conn.next_event()
                if ev is h11.NEED_DATA:
                    conn.receive_data(await reader.read(65536))
                elif isinstance(ev, h11.Data):
                    yield bytes(ev.data)
                else:  # EndOfMessage / ConnectionClosed
                    return
        except h11.ProtocolError:
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    resp = StreamingResponse(body_iter(), status_code=event.status_code)
    resp.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out_headers]
    return resp


async def forward_websocket(ctx: SandboxContext, ws: WebSocket, port: int, path: str) -> None:
    """Relay a WebSocket to ``ws://127.0.0.1:PORT/PATH`` inside the sandbox."""
    try:
        sock = await anyio.to_thread.run_sync(netns.connect, port, ctx.holder_pid)
    except OSError as exc:
        await ws.close(code=1011, reason=f"nothing listens on port {port}: {exc}"[:120])
        return
    sock.setblocking(False)
    query = ws.url.query
    uri = f"ws://127.0.0.1:{port}/{quote_path(path)}" + (f"?{query}" if query else "")
    try:
        async with websockets.connect(
            uri,
            sock=sock,
            subprotocols=requested_subprotocols(ws),  # type: ignore[arg-type]
            max_size=None,
            open_timeout=10,
        ) as upstream:
            await ws.accept(subprotocol=upstream.subprotocol)
            await relay(ws, upstream)
    except (TimeoutError, OSError, websockets.WebSocketException) as exc:
        with contextlib.suppress(Exception):
            await ws.close(code=1011, reason=f"port {port}: {exc}"[:120])

"""Service bridges, the agent's half: listeners inside the sandbox, relayed by long polls.

A bridge makes ``http://127.0.0.1:<port>`` inside a sandbox reach an upstream outside it
although the sandbox has no network. The orchestrator cannot be reached from the sandbox,
so the agent never calls out: it listens on the port (inside the sandbox's network
namespace), reads each HTTP/1.1 request with h11 and queues it; the orchestrator keeps
long polls open (``GET /bridges/next``) that take queued requests, forwards them upstream
and streams each answer back (``POST /bridges/{id}/response``), which the agent writes to
the waiting connection chunk by chunk (server-sent events arrive as they are sent).

Each connection carries one request (answers say ``Connection: close``). A request body
over the cap is answered 413 at once; more than ``MAX_CONNECTIONS`` connections, or more
than ``BUFFERED_REQUESTS`` caps' worth of bodies held at once, 503 ``bridge_busy``; a request no orchestrator takes within
``stale_after_s`` is answered 503; one taken but not answered within ``answer_within_s``
is answered 504. Those answers, like the orchestrator's own 502, are JSON
``{"detail", "code"}`` as every error of the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import h11
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from . import netns
from .errors import ApiError, invalid
from .ports import RFC_HOP_BY_HOP
from .validate import parse_json

if TYPE_CHECKING:
    from .context import SandboxContext

MAX_BRIDGES = 16
STALE_AFTER_S = 20.0  # no orchestrator took the request: 503
ANSWER_WITHIN_S = 900.0  # taken, but no answer started: 504
_HEAD_LIMIT = 64 * 1024  # request line and headers
_READ = 65536
_DISCARD_S = 30.0  # at most this long spent reading a refused body
_READ_REQUEST_S = 60.0  # a request's head and body must arrive within this
# Per sandbox, a sandbox cannot hold more of the agent (on the local backend one agent
# serves every sandbox): connections open at once, and request bodies held (queued or
# being forwarded) at once, in request caps. Beyond either, the caller gets 503.
MAX_CONNECTIONS = 64
BUFFERED_REQUESTS = 4
HEADER_STATUS = "x-orchard-bridge-status"
HEADER_HEADERS = "x-orchard-bridge-headers"
HEADER_REQUEST = "x-orchard-bridge-request"


@dataclass
class BridgeConfig:
    """What the orchestrator asked for (``POST /bridges``)."""

    ports: list[int]
    max_request_bytes: int = 32 << 20
    stale_after_s: float = STALE_AFTER_S
    answer_within_s: float = ANSWER_WITHIN_S


@dataclass
class Pending:
    """One request read from a sandbox connection, waiting for its answer."""

    request_id: str
    port: int
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    conn: h11.Connection
    writer: asyncio.StreamWriter
    taken: asyncio.Event = field(default_factory=asyncio.Event)
    # An answer (the orchestrator's, or the agent's own error) is being written.
    claimed: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def meta(self) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "port": self.port,
            "method": self.method,
            "target": self.target,
            "headers": self.headers,
        }


def _parse_config(body: Any) -> BridgeConfig:
    if not isinstance(body, dict) or set(body) - {
        "ports",
        "max_request_bytes",
        "stale_after_s",
        "answer_within_s",
    }:
        raise invalid("body must be {ports, max_request_bytes?, stale_after_s?, answer_within_s?}")
    ports = body.get("ports")
    if (
        not isinstance(ports, list)
        or len(ports) > MAX_BRIDGES
        or not all(
            isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 65535 for p in ports
        )
    ):
        raise invalid(f"ports must be a list of at most {MAX_BRIDGES} ports (1..65535)")
    config = BridgeConfig(ports=sorted(set(ports)))
    for name in ("max_request_bytes", "stale_after_s", "answer_within_s"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise invalid(f"{name} must be a positive number")
        setattr(config, name, int(value) if name == "max_request_bytes" else float(value))
    return config


def _listen(port: int, holder_pid: int | None) -> socket.socket:
    """Blocking (a worker thread): a listening socket on 127.0.0.1:port in the sandbox's
    network namespace (the holder's on the local backend, else the agent's own)."""
    sock = netns.socket_in(holder_pid)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _json_error(status: int, code: str, detail: str) -> tuple[h11.Response, bytes]:
    body = json.dumps({"detail": detail, "code": code}).encode()
    headers = [
        ("content-type", "application/json"),
        ("content-length", str(len(body))),
        ("connection", "close"),
    ]
    return h11.Response(status_code=status, headers=headers), body


class Bridges:
    """One sandbox's bridges: listeners, the queue of requests, the ones being answered."""

    def __init__(self, holder_pid: int | None) -> None:
        self._holder_pid = holder_pid
        self.config = BridgeConfig(ports=[])
        self._servers: dict[int, asyncio.Server] = {}
        self._queue: asyncio.Queue[Pending] = asyncio.Queue()
        self._waiting: dict[str, Pending] = {}  # taken, answer not yet claimed
        self._connections: set[asyncio.Task[None]] = set()
        self._buffered = 0  # bytes of request bodies held now

    @property
    def ports(self) -> list[int]:
        return sorted(self._servers)

    async def configure(self, body: Any) -> list[int]:
        """Listen on exactly the given ports (idempotent: kept ports keep their listener)."""
        config = _parse_config(body)
        for port in set(self._servers) - set(config.ports):
            self._servers.pop(port).close()
        for port in config.ports:
            if port in self._servers:
                continue
            try:
                sock = await anyio.to_thread.run_sync(_listen, port, self._holder_pid)
            except OSError as exc:
                raise ApiError(
                    409,
                    "bridge_port_unavailable",
                    f"cannot listen on 127.0.0.1:{port} in the sandbox: {exc}",
                ) from None
            self._servers[port] = await asyncio.start_server(
                functools.partial(self._accept, port), sock=sock, limit=_READ
            )
        self.config = config
        return self.ports

    async def close(self) -> None:
        """Stop listening and drop every connection (the sandbox is going away)."""
        for server in self._servers.values():
            server.close()
        self._servers.clear()
        for task in list(self._connections):
            task.cancel()

    # -- the orchestrator's side ------------------------------------------------------
    async def next(self, wait: float, gone: asyncio.Future[None]) -> Pending | None:
        """The oldest queued request, or None after ``wait`` s (or once ``gone`` is done:
        the poller hung up, so a request handed to it would be lost)."""
        getter = asyncio.ensure_future(self._queue.get())
        try:
            either: set[asyncio.Future[Any]] = {getter, gone}
            await asyncio.wait(either, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.cancelled() or not getter.done():
            return None
        pending = getter.result()
        if pending.claimed.is_set():  # refused meanwhile (503): not to be sent upstream
            return None
        if gone.done():
            self._queue.put_nowait(pending)  # not sent anywhere: queue it again
            return None
        pending.taken.set()
        self._waiting[pending.request_id] = pending
        return pending

    async def answer(
        self,
        request_id: str,
        status: int,
        headers: list[tuple[str, str]],
        body: AsyncIterator[bytes],
    ) -> bool:
        """Write the orchestrator's answer to the waiting connection as it arrives; False
        when the caller in the sandbox went away before the end."""
        pending = self._waiting.pop(request_id, None)
        if pending is None or pending.claimed.is_set():
            raise ApiError(404, "bridge_request_not_found", f"no request {request_id!r} waits")
        pending.claimed.set()
        try:
            writer, conn = pending.writer, pending.conn
            writer.write(conn.send(_response_head(status, headers)))
            await writer.drain()
            async for chunk in body:
                if chunk:
                    writer.write(conn.send(h11.Data(data=chunk)))
                    await writer.drain()  # flushed per chunk: events are not held back
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
            return True
        except (OSError, h11.LocalProtocolError):
            return False
        except UnicodeEncodeError:  # a header beyond latin-1: the caller is told so
            await _refuse(writer, conn, 502, "bad_upstream_answer", "unsendable headers")
            return False
        finally:
            pending.done.set()

    # -- the sandbox's side -----------------------------------------------------------
    async def _accept(
        self, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= MAX_CONNECTIONS:
            busy = f"the sandbox has {MAX_CONNECTIONS} bridge connections open already"
            writer.write(_raw_error(503, "bridge_busy", busy))
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.close()
            return
        self._connections.add(task)
        try:
            await self._serve(port, reader, writer)
        except (OSError, h11.ProtocolError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(
        self, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_HEAD_LIMIT)
        held = 0
        try:
            async with asyncio.timeout(_READ_REQUEST_S):  # slow callers hold no slot
                read = await self._read_request(port, conn, reader, writer)
                held = len(read.body) if read is not None else 0
            if read is not None:
                await self._relay(read)
        finally:
            self._buffered -= held

    async def _read_request(
        self,
        port: int,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> Pending | None:
        """The request, its body counted in ``_buffered`` (the caller gives it back), or
        None when it was refused or the caller went away."""
        request = await _next_event(conn, reader)
        if not isinstance(request, h11.Request):
            return None
        cap = self.config.max_request_bytes
        budget = cap * BUFFERED_REQUESTS
        length = _content_length(request)
        if length is not None and length > cap:
            await _refuse(
                writer,
                conn,
                413,
                "too_large",
                f"request body of {length} bytes exceeds the bridge's {cap}",
            )
            await _discard_rest(reader)
            return None
        if conn.they_are_waiting_for_100_continue:
            writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
        body = bytearray()
        complete = False
        try:
            while True:
                event = await _next_event(conn, reader)
                if isinstance(event, h11.EndOfMessage):
                    complete = True
                    break
                if not isinstance(event, h11.Data):
                    return None
                body += event.data
                self._buffered += len(event.data)
                if len(body) > cap:
                    status, code = 413, "too_large"
                    detail = f"request body exceeds the bridge's {cap} bytes"
                elif self._buffered > budget:
                    status, code = 503, "bridge_busy"
                    detail = f"the sandbox's bridged requests hold {budget} bytes already"
                else:
                    continue
                await _refuse(writer, conn, status, code, detail)
                await _discard_rest(reader)
                return None
        finally:
            if not complete:
                self._buffered -= len(body)
        return Pending(
            request_id=secrets.token_hex(12),
            port=port,
            method=request.method.decode("ascii"),
            target=request.target.decode("latin-1"),
            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers],
            body=bytes(body),
            conn=conn,
            writer=writer,
        )

    async def _relay(self, pending: Pending) -> None:
        self._queue.put_nowait(pending)
        try:
            await asyncio.wait_for(pending.taken.wait(), self.config.stale_after_s)
        except TimeoutError:
            _drop_from_queue(self._queue, pending)
            pending.claimed.set()  # a poll that got it meanwhile must not relay it now
            await _refuse(
                pending.writer,
                pending.conn,
                503,
                "bridge_unavailable",
                "no orchestrator is relaying this sandbox's bridges now",
            )
            return
        try:
            await asyncio.wait_for(pending.claimed.wait(), self.config.answer_within_s)
        except TimeoutError:
            self._waiting.pop(pending.request_id, None)
            if not pending.claimed.is_set():
                pending.claimed.set()
                await _refuse(
                    pending.writer,
                    pending.conn,
                    504,
                    "bridge_timeout",
                    "the upstream's answer did not start in time",
                )
                return
        await pending.done.wait()


def _response_head(status: int, headers: list[tuple[str, str]]) -> h11.Response:
    """The answer's head: the upstream's end-to-end headers as it sent them (latin-1, as
    they were read), then ``Connection: close``; UnicodeEncodeError beyond latin-1."""
    head = [
        (k.encode("latin-1"), v.encode("latin-1"))
        for k, v in headers
        if k.lower() not in RFC_HOP_BY_HOP
    ]
    head.append((b"connection", b"close"))
    return h11.Response(status_code=status, headers=head)


def _raw_error(status: int, code: str, detail: str) -> bytes:
    """A whole JSON error answer, for a connection refused before its request is read
    (h11 answers only a request it has read)."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    conn.next_event()
    response, body = _json_error(status, code, detail)
    return conn.send(response) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())


def _drop_from_queue(queue: asyncio.Queue[Pending], pending: Pending) -> None:
    kept = []
    while not queue.empty():
        item = queue.get_nowait()
        if item is not pending:
            kept.append(item)
    for item in kept:
        queue.put_nowait(item)


def _content_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length":
            with contextlib.suppress(ValueError):
                return int(value)
    return None


async def _discard_rest(reader: asyncio.StreamReader) -> None:
    """Read what the caller still sends after a refusal, so that closing does not reset
    the connection (and lose the answer) while its body is in flight."""
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(_DISCARD_S):
            while await reader.read(_READ):
                pass


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await reader.read(_READ))


async def _refuse(
    writer: asyncio.StreamWriter, conn: h11.Connection, status: int, code: str, detail: str
) -> None:
    response, body = _json_error(status, code, detail)
    with contextlib.suppress(h11.LocalProtocolError, OSError):
        writer.write(conn.send(response))
        writer.write(conn.send(h11.Data(data=body)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()


# -- the agent's routes (app.py hands each its sandbox) ------------------------------------
async def configure_route(ctx: SandboxContext, request: Request) -> Response:
    """``POST /bridges {"ports": [...], ...}``: listen on exactly these ports."""
    ports = await ctx.bridges.configure(parse_json(await request.body()))
    return JSONResponse({"ports": ports})


async def next_route(ctx: SandboxContext, request: Request) -> Response:
    """``GET /bridges/next?wait=S``: the next request (its body, the rest as JSON in a
    header) or 204 when none came within ``wait`` seconds."""
    raw = request.query_params.get("wait", "30")
    try:
        wait = min(max(float(raw), 0.0), 120.0)
    except ValueError:
        raise ApiError(400, "invalid_wait", f"wait must be a number, not {raw!r}") from None
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        pending = await ctx.bridges.next(wait, gone)
    finally:
        gone.cancel()
    if pending is None:
        return Response(status_code=204)
    meta = json.dumps(pending.meta())
    return Response(
        pending.body, media_type="application/octet-stream", headers={HEADER_REQUEST: meta}
    )


async def answer_route(ctx: SandboxContext, request: Request) -> Response:
    """``POST /bridges/{id}/response``: status and headers in this request's headers, the
    upstream's body as this request's (streamed) body."""
    try:
        status = int(request.headers[HEADER_STATUS])
        pairs = json.loads(request.headers.get(HEADER_HEADERS, "[]"))
        headers = [(str(k), str(v)) for k, v in pairs]
    except (KeyError, ValueError, TypeError) as exc:
        raise invalid(f"{HEADER_STATUS} and {HEADER_HEADERS} must say the answer: {exc}") from None
    if not 100 <= status <= 599:
        raise invalid(f"status {status} is out of range")
    delivered = await ctx.bridges.answer(
        request.path_params["request_id"], status, headers, request.stream()
    )
    return JSONResponse({"delivered": delivered})


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass

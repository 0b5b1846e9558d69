"""A recording OpenAI-compatible proxy: every model call of a harness becomes a record.

:class:`RecordingProxy` listens on 127.0.0.1 (a free port, a background thread) and forwards
everything under ``/v1/`` to an upstream model server (``upstream_base_url`` ends in
``/v1``): method, query, body and headers (minus hop-by-hop ones, so ``Authorization``
passes; ``Host`` is the upstream's). The answer streams back as it arrives (SSE events are
not held back). One proxy serves many runs: a request to ``/r/<run_id>/v1/...`` is tagged
with that run id (and sent upstream with an ``X-Orchard-Run-Id`` header), one to plain
``/v1/...`` with ``"default"``.

Each request/answer pair is an :class:`Exchange` (endpoint, request JSON, answer JSON or,
for a stream, the raw SSE events and the answer reassembled into its non-streaming shape,
status, timings, usage, token ids when the upstream returns them), kept in memory
(:meth:`RecordingProxy.exchanges`) and appended to a JSON-lines file when ``record_path``
is given (:func:`read_exchanges` reads it back). An unreachable upstream is answered 502
(JSON) and recorded with its ``error``.

:func:`to_trajectory` turns one run's exchanges, chat completions or Responses API, into an
:class:`orchard_env_client.trajectory.Trajectory` (see its doc). Outside proxies configured
in the environment are not used to reach the upstream.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import httpx

from . import openai_wire as wire
from ._http_server import BackgroundServer, Handler
from .trajectory import Trajectory, TrajectoryMetadata, TrajectoryStep, TurnTokens

__all__ = [
    "DEFAULT_RUN",
    "RUN_ID_HEADER",
    "Exchange",
    "RecordingProxy",
    "read_exchanges",
    "to_trajectory",
]

DEFAULT_RUN = "default"
"""The run id of requests to plain ``/v1/...``."""
RUN_ID_HEADER = "X-Orchard-Run-Id"
"""Sent upstream with a request to ``/r/<run_id>/v1/...``: the run it belongs to (a
scripted model tells runs apart by it)."""

_PATH = re.compile(r"(?:/r/(?P<run>[A-Za-z0-9._:-]{1,128}))?/v1(?P<rest>/.*)?")
_HOP_BY_HOP = frozenset(
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
_NOT_FORWARDED = _HOP_BY_HOP | {"host", "content-length", "accept-encoding"}
_NOT_RETURNED = _HOP_BY_HOP | {"content-length", "content-encoding"}
_MAX_RECORDED = 64 * 1024 * 1024
"""A non-streaming answer larger than this is passed on but not recorded."""
_MODEL_ENDPOINTS = ("chat/completions", "responses")


@attrs.define(kw_only=True)
class Exchange:
    """One request through the proxy and its answer."""

    run_id: str
    method: str
    endpoint: str
    """The path after ``/v1/`` without the query: ``chat/completions``, ``responses``, ..."""
    path: str = ""
    """The path (and query) sent upstream, after the upstream base URL."""
    status: int = 0
    """The upstream's status (502: the upstream was unreachable)."""
    stream: bool = False
    """The answer was an SSE stream."""
    request: Any = None
    """The request body parsed as JSON (None when it was empty or not JSON)."""
    response: Any = None
    """The answer as JSON; for a stream, reassembled into the non-streaming shape."""
    events: list[dict[str, Any]] | None = None
    """A stream's raw events: ``[{"event": name or None, "data": text}]``."""
    usage: dict[str, int] | None = None
    """``{"prompt_tokens", "completion_tokens", "total_tokens"}`` when the answer had usage."""
    token_ids: dict[str, Any] | None = None
    """``{"prompt_ids", "completion_ids", "logprobs"}`` when the upstream returned them."""
    started_at: float = 0.0
    ended_at: float = 0.0
    error: str | None = None
    """What went wrong (upstream unreachable, the stream broke, the caller went away)."""

    @property
    def api(self) -> str:
        """``"chat"``, ``"responses"`` or ``""`` (not a model call)."""
        return {"chat/completions": "chat", "responses": "responses"}.get(self.endpoint, "")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return attrs.asdict(self, recurse=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Exchange:
        """Build from :meth:`to_dict` output; unknown keys are ignored."""
        names = {f.name for f in attrs.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def read_exchanges(path: str | os.PathLike[str]) -> list[Exchange]:
    """The exchanges of a proxy's JSON-lines file (a torn last line is skipped)."""
    out: list[Exchange] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            out.append(Exchange.from_dict(data))
    return out


class RecordingProxy(BackgroundServer):
    """The recording proxy (see the module doc). Use as a context manager or
    :meth:`start` / :meth:`stop`; ``timeout_s`` bounds each upstream read."""

    _thread_name = "recording-proxy"

    def __init__(
        self,
        upstream_base_url: str,
        record_path: str | os.PathLike[str] | None = None,
        *,
        timeout_s: float = 600.0,
    ) -> None:
        super().__init__()
        self.upstream_base_url = upstream_base_url.rstrip("/")
        self.record_path = Path(record_path) if record_path is not None else None
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._exchanges: list[Exchange] = []
        self._client: httpx.Client | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1`` (run id ``default``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def run_url(self, run_id: str) -> str:
        """``http://127.0.0.1:<port>/r/<run_id>/v1``: the base URL of one run."""
        if not _PATH.fullmatch(f"/r/{run_id}/v1"):
            raise ValueError(f"a run id is 1-128 of [A-Za-z0-9._:-]: {run_id!r}")
        return f"http://127.0.0.1:{self.port}/r/{run_id}/v1"

    def exchanges(self, run_id: str | None = None) -> list[Exchange]:
        """The exchanges recorded so far (of one run), in the order they completed. An
        exchange is recorded before its caller sees the end of the answer."""
        with self._lock:
            return [e for e in self._exchanges if run_id is None or e.run_id == run_id]

    def start(self) -> None:
        """Start serving (and open the upstream connection pool)."""
        self._client = httpx.Client(
            timeout=httpx.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s)),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            trust_env=False,
        )
        super().start()

    def stop(self) -> None:
        """Stop serving and close the upstream connections."""
        super().stop()
        if self._client is not None:
            self._client.close()
            self._client = None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Bound(_ProxyHandler):
            recorder = proxy

        return Bound

    def _record(self, exchange: Exchange) -> None:
        line = json.dumps(exchange.to_dict(), ensure_ascii=False) + "\n"
        with self._lock:
            self._exchanges.append(exchange)
            if self.record_path is not None:
                self.record_path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.record_path, "a", encoding="utf-8") as fh:
                    fh.write(line)
                    fh.flush()
                    os.fsync(fh.fileno())


def _json_or_none(data: bytes) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def _reassemble(endpoint: str, events: Sequence[wire.SSEEvent]) -> Any:
    assembler: wire.ChatStreamAssembler | wire.ResponsesStreamAssembler
    if endpoint == "responses":
        assembler = wire.ResponsesStreamAssembler()
    elif endpoint == "chat/completions":
        assembler = wire.ChatStreamAssembler()
    else:
        return None
    for event in events:
        assembler.add(event.json())
    return assembler.result()


class _ProxyHandler(Handler):
    recorder: RecordingProxy
    _recorded = False
    _run: str | None = None

    def _forward_headers(self) -> list[tuple[str, str]]:
        listed = {
            name.strip().lower() for name in (self.headers.get("Connection") or "").split(",")
        }
        headers = [
            (name, value)
            for name, value in self.headers.items()
            if name.lower() not in _NOT_FORWARDED
            and name.lower() not in listed
            and name.lower() != RUN_ID_HEADER.lower()
        ]
        if self._run is not None:
            headers.append((RUN_ID_HEADER, self._run))
        return [*headers, ("Accept-Encoding", "identity")]

    def _proxy(self) -> None:
        split = urlsplit(self.path)
        match = _PATH.fullmatch(split.path)
        if match is None:
            self.send_error_json(
                404, f"not a model route (/v1/... or /r/<run>/v1/...): {split.path}"
            )
            return
        body = self.read_body()
        if body is None:
            return
        rest = match["rest"] or ""
        self._run = match["run"]
        path = rest + (f"?{split.query}" if split.query else "")
        exchange = Exchange(
            run_id=match["run"] or DEFAULT_RUN,
            method=self.command,
            endpoint=rest.strip("/"),
            path=path,
            request=_json_or_none(body),
            started_at=time.time(),
        )
        self._recorded = False
        try:
            self._relay(exchange, body)
        except OSError as exc:  # the caller went away
            exchange.error = f"caller: {type(exc).__name__}: {exc}"
            self.close_connection = True
        finally:
            self._done(exchange)

    def _done(self, exchange: Exchange) -> None:
        """Record ``exchange`` (once), before the caller sees the end of the answer."""
        if not self._recorded:
            self._recorded = True
            exchange.ended_at = time.time()
            self.recorder._record(exchange)

    def _relay(self, exchange: Exchange, body: bytes) -> None:
        client = self.recorder._client
        assert client is not None, "the proxy is not running"
        url = self.recorder.upstream_base_url + exchange.path
        try:
            with client.stream(
                self.command, url, headers=self._forward_headers(), content=body
            ) as upstream:
                self._pass_back(exchange, upstream)
        except httpx.TransportError as exc:
            exchange.error = f"upstream: {type(exc).__name__}: {exc}"
            if exchange.status == 0:  # nothing sent yet: tell the caller
                exchange.status = 502
                self._done(exchange)
                self.close_connection = True
                self.send_json(
                    502,
                    {
                        "error": {
                            "message": f"the upstream model server is unreachable: {exc}",
                            "type": "upstream_error",
                            "code": "upstream_unreachable",
                        }
                    },
                )
            else:
                self.close_connection = True

    def _pass_back(self, exchange: Exchange, upstream: httpx.Response) -> None:
        exchange.status = upstream.status_code
        headers = {
            name: value
            for name, value in upstream.headers.multi_items()
            if name.lower() not in _NOT_RETURNED
        }
        if self.command == "HEAD" or upstream.status_code in (204, 304):
            self._done(exchange)
            self.send_response(upstream.status_code)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            return
        exchange.stream = upstream.headers.get("content-type", "").startswith("text/event-stream")
        parser = wire.SSEParser() if exchange.stream else None
        events: list[wire.SSEEvent] = []
        data = bytearray()
        self.start_stream(upstream.status_code, headers)
        caller_gone = False
        for chunk in upstream.iter_bytes():
            try:
                self.write_chunk(chunk)
            except OSError:
                caller_gone = True
                exchange.error = "the caller went away before the answer ended"
                self.close_connection = True
                break
            if parser is not None:
                events.extend(parser.feed(chunk))
            elif len(data) + len(chunk) <= _MAX_RECORDED:
                data += chunk
        if parser is not None:
            events.extend(parser.close())
            exchange.events = [e.to_dict() for e in events]
            exchange.response = _reassemble(exchange.endpoint, events)
        else:
            exchange.response = _json_or_none(bytes(data))
        exchange.usage = wire.usage_of(exchange.response)
        exchange.token_ids = wire.token_ids_of(exchange.response)
        self._done(exchange)
        if not caller_gone:
            self.end_stream()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = _proxy


# ---------------------------------------------------------------- trajectories


@attrs.define
class _Turn:
    exchange: Exchange
    conversation: list[dict[str, Any]]
    reply: dict[str, Any] | None


def _coerce(exchange: Exchange | Mapping[str, Any]) -> Exchange:
    return exchange if isinstance(exchange, Exchange) else Exchange.from_dict(exchange)


def _turns(exchanges: Iterable[Exchange]) -> list[_Turn]:
    """The model calls in order, each with its conversation and reply (chat shape)."""
    calls = sorted(
        (e for e in exchanges if e.api and isinstance(e.request, Mapping)),
        key=lambda e: e.started_at,
    )
    history: dict[str, list[dict[str, Any]]] = {}
    turns: list[_Turn] = []
    for exchange in calls:
        ok = exchange.status == 200 and isinstance(exchange.response, Mapping)
        response: Mapping[str, Any] = exchange.response if ok else {}
        if exchange.api == "chat":
            conversation = [dict(m) for m in exchange.request.get("messages") or []]
            choices = response.get("choices") or [{}]
            message = choices[0].get("message") if isinstance(choices[0], Mapping) else None
            reply = dict(message) if isinstance(message, Mapping) else None
        else:
            behind = history.get(str(exchange.request.get("previous_response_id") or ""), [])
            conversation = wire.responses_conversation(exchange.request, behind)
            reply = wire.responses_reply(response) if response.get("output") else None
            if reply is not None and response.get("id"):
                kept = [m for m in conversation if m.get("role") != "system"]
                history[str(response["id"])] = [*kept, reply]
        turns.append(_Turn(exchange, conversation, reply))
    return turns


def _signature(message: Mapping[str, Any]) -> tuple[Any, ...]:
    calls = tuple(
        str((c.get("function") or {}).get("name")) for c in message.get("tool_calls") or []
    )
    return (message.get("role"), wire.content_text(message.get("content")), calls)


def _reply_index(messages: Sequence[Mapping[str, Any]], turn: _Turn) -> int | None:
    """Where ``turn``'s reply stands in ``messages`` (None: another conversation's call)."""
    n = len(turn.conversation)
    if turn.reply is None or n >= len(messages):
        return None
    same = all(
        _signature(a) == _signature(b) for a, b in zip(messages, turn.conversation, strict=False)
    )
    if same and _signature(messages[n]) == _signature(turn.reply):
        return n
    return None


def _tool_results(messages: Sequence[Mapping[str, Any]], reply: Mapping[str, Any]) -> list[Any]:
    ids = {c.get("id") for c in reply.get("tool_calls") or []}
    return [
        {"tool_call_id": m.get("tool_call_id"), "content": m.get("content")}
        for m in messages
        if m.get("role") == "tool" and m.get("tool_call_id") in ids
    ]


def _step(index: int, turn: _Turn, messages: list[dict[str, Any]]) -> TrajectoryStep:
    exchange, reply = turn.exchange, turn.reply
    error = exchange.error
    if error is None and exchange.status != 200:
        error = f"HTTP {exchange.status}"
    action = None
    observation: dict[str, Any] = {}
    if reply is not None:
        action = {
            "content": wire.content_text(reply.get("content")),
            "tool_calls": list(reply.get("tool_calls") or []),
        }
        results = _tool_results(messages, reply)
        if results:
            observation["tool_results"] = results
    return TrajectoryStep(
        index=index,
        action=action,
        observation=observation,
        message_index=_reply_index(messages, turn),
        error=error,
        extra={
            "run_id": exchange.run_id,
            "endpoint": exchange.endpoint,
            "status": exchange.status,
            "stream": exchange.stream,
            "started_at": exchange.started_at,
            "ended_at": exchange.ended_at,
            "duration_s": exchange.ended_at - exchange.started_at,
            "usage": exchange.usage,
        },
    )


def to_trajectory(
    exchanges: Iterable[Exchange | Mapping[str, Any]], metadata: TrajectoryMetadata
) -> Trajectory:
    """One run's exchanges (objects or their dicts, as in the JSONL) as a trajectory.

    ``messages`` is the longest conversation sent (the last of equals) plus the reply to it,
    in chat shape: a Responses-API run's ``instructions`` and ``input`` items are converted
    (see :mod:`orchard_env_client.openai_wire`); side calls (a harness's title request) are
    steps but not messages. ``tools`` are that call's tools in chat shape. One step per model
    call, in order: ``action`` is the reply's text and tool calls, ``observation.tool_results``
    what the harness sent back for those calls, ``message_index`` the reply's place in
    ``messages`` (None for a side call), ``error`` a failed call's, ``extra`` its endpoint,
    status and timings. Tokens are summed over the calls' usage; ``token_ids`` holds the
    calls whose upstream returned ids. ``metadata`` is completed: ``steps``, tokens,
    ``started_at``/``finished_at``/``duration_s`` (when unset), ``model`` and
    ``final_output`` (the last reply's text) when empty, and ``extra`` gains ``api``,
    ``run_ids`` and ``failed_calls``.
    """
    turns = _turns(_coerce(e) for e in exchanges)
    answered = [(len(t.conversation), i) for i, t in enumerate(turns) if t.reply is not None]
    main = turns[max(answered)[1]] if answered else None
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    if main is not None and main.reply is not None:
        messages = [*main.conversation, main.reply]
        tools = wire.chat_tools(main.exchange.request.get("tools"))
    steps = [_step(i, turn, messages) for i, turn in enumerate(turns)]
    token_ids = [
        TurnTokens(
            message_index=step.message_index,
            prompt_ids=list(turn.exchange.token_ids.get("prompt_ids") or []),
            completion_ids=list(turn.exchange.token_ids.get("completion_ids") or []),
            logprobs=turn.exchange.token_ids.get("logprobs"),
        )
        for turn, step in zip(turns, steps, strict=True)
        if turn.exchange.token_ids and step.message_index is not None
    ]
    usages = [t.exchange.usage or {} for t in turns]
    started = min((t.exchange.started_at for t in turns), default=0.0)
    finished = max((t.exchange.ended_at for t in turns), default=0.0)
    apis = sorted({t.exchange.api for t in turns})
    meta = attrs.evolve(
        metadata,
        steps=len(turns),
        prompt_tokens=sum(u.get("prompt_tokens", 0) for u in usages),
        completion_tokens=sum(u.get("completion_tokens", 0) for u in usages),
        started_at=metadata.started_at or started,
        finished_at=metadata.finished_at or finished,
        duration_s=metadata.duration_s or max(0.0, finished - started),
        model=metadata.model
        or (str(main.exchange.request.get("model") or "") if main is not None else ""),
        final_output=metadata.final_output
        or (wire.content_text(main.reply.get("content")) if main and main.reply else ""),
        extra={
            **metadata.extra,
            "api": "+".join(apis),
            "run_ids": sorted({t.exchange.run_id for t in turns}),
            "failed_calls": sum(1 for s in steps if s.error is not None),
        },
    )
    return Trajectory(
        metadata=meta, messages=messages, tools=tools, steps=steps, token_ids=token_ids
    )

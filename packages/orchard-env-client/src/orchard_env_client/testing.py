"""A scripted OpenAI-compatible model server, for testing any recipe's harness without a model.

:class:`ScriptedModelServer` serves ``POST /v1/chat/completions`` and ``GET /v1/models`` on
127.0.0.1 (a free port, a background thread; standard library only). Each conversation is
matched to a registered script by a key: the ``X-Orchard-Instance-Id`` header the harnesses
send, else the longest registered key that occurs in the conversation's message text, else
the default responder. A script is either a list of replies, replayed by the number of
assistant messages already in the request, or a *responder*: a callable that receives the
:class:`ChatRequest` and returns the reply (a scripted policy that reads the observation in
the prompt). A reply is a :class:`Step`, a text string, ``{"tool": name, "arguments":
{...}}``, ``{"text": ...}`` or ``{"tool_calls": [...], "content": ...}``.

Token usage is estimated as characters / 4. Every request is recorded in ``requests``.
"""

from __future__ import annotations

import json
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs

from .llm import INSTANCE_ID_HEADER

__all__ = [
    "ChatRequest",
    "RequestRecord",
    "Responder",
    "Script",
    "ScriptedModelServer",
    "Step",
    "ToolCall",
]

_MAX_BODY = 64 * 1024 * 1024


@attrs.define(frozen=True)
class ToolCall:
    """One tool call of a scripted reply; ``arguments`` as a string is sent verbatim."""

    name: str
    arguments: Mapping[str, Any] | str = attrs.field(factory=dict)

    def arguments_json(self) -> str:
        """The arguments as the JSON string the API carries."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(dict(self.arguments))


@attrs.define(frozen=True)
class Step:
    """One scripted assistant reply: text ``content`` and/or ``tool_calls``."""

    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()

    @classmethod
    def coerce(cls, value: Step | str | Mapping[str, Any]) -> Step:
        """A step from a ``Step``, a text reply, ``{"tool": name, "arguments": {...}}``,
        ``{"text": ...}`` / ``{"content": ...}``, or ``{"tool_calls": [...], "content": ...}``."""
        if isinstance(value, Step):
            return value
        if isinstance(value, str):
            return cls(content=value)
        content = str(value.get("content", value.get("text", "")) or "")
        if "tool" in value:
            call = ToolCall(str(value["tool"]), value.get("arguments", {}))
            return cls(content=content, tool_calls=(call,))
        calls = tuple(
            ToolCall(str(c.get("tool", c.get("name", ""))), c.get("arguments", {}))
            for c in value.get("tool_calls", ())
        )
        return cls(content=content, tool_calls=calls)


@attrs.define
class Script:
    """The replies of one conversation, in order; with ``repeat_last`` the last one repeats
    forever (a model stuck in a loop), else running past the end is an error (400)."""

    steps: list[Step] = attrs.field(factory=list)
    repeat_last: bool = False

    def step(self, index: int) -> Step | None:
        """The reply at ``index`` (None when the script is exhausted)."""
        if index < len(self.steps):
            return self.steps[index]
        if self.repeat_last and self.steps:
            return self.steps[-1]
        return None


@attrs.define(frozen=True)
class ChatRequest:
    """What a responder sees of one chat request."""

    body: dict[str, Any]
    headers: dict[str, str]
    key: str | None
    """The registered key the conversation matched (None for the default responder)."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The request's messages."""
        return [m for m in self.body.get("messages") or [] if isinstance(m, dict)]

    @property
    def tool_names(self) -> list[str]:
        """Names of the function tools offered."""
        return [
            str(t["function"].get("name", ""))
            for t in self.body.get("tools") or []
            if isinstance(t, dict) and isinstance(t.get("function"), dict)
        ]

    @property
    def step(self) -> int:
        """Assistant messages already in the conversation (the index of the reply asked for)."""
        return sum(1 for m in self.messages if m.get("role") == "assistant")


ReplyLike = Step | str | Mapping[str, Any]
Responder = Callable[[ChatRequest], ReplyLike]
ScriptLike = Script | Sequence[ReplyLike] | Responder


@attrs.define
class RequestRecord:
    """What the server saw of one chat request (for tests)."""

    instance_id: str | None
    step: int
    n_messages: int
    tools: list[str]
    status: int
    authorization: str | None = attrs.field(default=None, repr=False)
    """The ``Authorization`` header sent (this is a test server: it checks no keys); kept
    out of ``repr`` so a failing test does not print a real key."""
    body: dict[str, Any] = attrs.field(factory=dict, repr=False)
    """The request body as sent."""


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a message's ``content`` (string, or the text parts of a list)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _count_tokens(text: str) -> int:
    return max(1, len(text) // 4)


class _Failure(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ScriptedModelServer:
    """OpenAI-compatible chat server replaying registered scripts (see the module doc).

    Use as a context manager (or :meth:`start` / :meth:`stop`); ``base_url`` ends in ``/v1``.
    """

    def __init__(self, model_name: str = "scripted") -> None:
        self.model_name = model_name
        self._scripts: dict[str, Script | Responder] = {}
        self._default: Responder | None = None
        self._lock = threading.Lock()
        self.requests: list[RequestRecord] = []
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._counter = 0

    # ------------------------------------------------------------ scripts

    def add(self, key: str, script: ScriptLike) -> None:
        """Register (or replace) the script or responder of conversations about ``key``."""
        entry: Script | Responder
        if isinstance(script, Script) or callable(script):
            entry = script
        else:
            entry = Script([Step.coerce(s) for s in script])
        with self._lock:
            self._scripts[key] = entry

    def remove(self, key: str) -> None:
        """Forget the script of ``key``."""
        with self._lock:
            self._scripts.pop(key, None)

    def set_default(self, responder: Responder | None) -> None:
        """The responder of conversations that match no registered key (None: a 400)."""
        self._default = responder

    def _match(self, header: str | None, messages: Sequence[Mapping[str, Any]]) -> str | None:
        with self._lock:
            if header and header in self._scripts:
                return header
            keys = sorted(self._scripts, key=len, reverse=True)
        text = "\n".join(message_text(m) for m in messages if isinstance(m, Mapping))
        return next((k for k in keys if k in text), None)

    # ------------------------------------------------------------ lifetime

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``."""
        if self._httpd is None:
            raise RuntimeError("the server is not running")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> None:
        """Start serving in a background thread (it accepts connections on return)."""
        if self._httpd is not None:
            raise RuntimeError("the server is already running")
        server = self

        class Handler(_Handler):
            scripted = server

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="scripted-model"
        )
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> ScriptedModelServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------ answering

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self.requests.append(record)

    def models(self) -> dict[str, Any]:
        """The ``/v1/models`` answer."""
        return {
            "object": "list",
            "data": [{"id": self.model_name, "object": "model", "owned_by": "orchard"}],
        }

    def chat(self, body: Any, headers: dict[str, str]) -> dict[str, Any]:
        """The ``/v1/chat/completions`` answer; raises ``_Failure`` for a 4xx."""
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list):
            raise _Failure(400, "the request has no `messages` list")
        key = self._match(headers.get(INSTANCE_ID_HEADER.lower()), messages)
        request = ChatRequest(body=body, headers=headers, key=key)
        record = RequestRecord(
            key,
            request.step,
            len(messages),
            request.tool_names,
            200,
            headers.get("authorization"),
            body,
        )
        try:
            step = self._reply(request)
        except _Failure as failure:
            record.status = failure.status
            self._record(record)
            raise
        self._record(record)
        with self._lock:
            self._counter += 1
            serial = self._counter
        return self._completion(body, step, serial)

    def _reply(self, request: ChatRequest) -> Step:
        with self._lock:
            entry = self._scripts.get(request.key) if request.key is not None else self._default
            known = sorted(self._scripts)
        if entry is None:
            raise _Failure(
                400,
                "unknown conversation: no registered key in the "
                f"{INSTANCE_ID_HEADER} header or the messages (registered: {known})",
            )
        if isinstance(entry, Script):
            step = entry.step(request.step)
            if step is None:
                raise _Failure(
                    400,
                    f"the script of {request.key!r} has {len(entry.steps)} steps; "
                    f"step {request.step} was requested",
                )
            return step
        return Step.coerce(entry(request))

    def _completion(self, body: Mapping[str, Any], step: Step, serial: int) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": step.content or None}
        if step.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{serial}_{i}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments_json()},
                }
                for i, call in enumerate(step.tool_calls)
            ]
        elif message["content"] is None:
            message["content"] = ""
        prompt_tokens = _count_tokens(json.dumps(body.get("messages")))
        completion_tokens = _count_tokens(
            (step.content or "") + "".join(c.arguments_json() for c in step.tool_calls)
        )
        return {
            "id": f"chatcmpl-scripted-{serial}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model") or self.model_name),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if step.tool_calls else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


class _Handler(BaseHTTPRequestHandler):
    scripted: ScriptedModelServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, payload: Mapping[str, Any]) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        error = {"message": message, "type": "invalid_request_error", "code": status}
        self._send(status, {"error": error})

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, self.scripted.models())
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            self._error(413, "the request body is too large")
            return
        raw = self.rfile.read(length)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._error(404, f"no route {self.path}")
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._error(400, "the request body is not JSON")
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            self._send(200, self.scripted.chat(body, headers))
        except _Failure as failure:
            self._error(failure.status, str(failure))
        except Exception as exc:  # a responder's bug: answer it, do not hang the client
            self._error(500, f"the responder failed: {type(exc).__name__}: {exc}")

"""A scripted OpenAI-compatible model server, for testing any harness without a model.

:class:`ScriptedModelServer` serves, on 127.0.0.1 (a free port, a background thread;
standard library only), ``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST
/v1/responses`` (the Responses API, which codex speaks), each plain or streamed (``"stream":
true``: SSE chat chunks with text and tool-call deltas ending in ``[DONE]``, and a usage
chunk when ``stream_options.include_usage``; Responses events ``response.created`` ...
``response.completed``). Routes are matched by their ending, so any path prefix before
``/v1/`` (``/r/<run>/v1/...`` through the recording proxy) or none works.

Each conversation is matched to a registered script by a key: the ``X-Orchard-Instance-Id``
header the harnesses send, else the longest registered key that occurs in the conversation's
message text, else the default responder. A script is either a list of replies, replayed by
the number of assistant turns already in the request, or a *responder*: a callable that
receives the :class:`ChatRequest` and returns the reply (a scripted policy that reads the
observation in the prompt). A :class:`ChatRequest` shows the conversation as chat messages
whichever API it came by (Responses ``instructions`` and ``input`` items are converted, see
:mod:`orchard_env_client.openai_wire`), so one policy drives any harness. A reply is a
:class:`Step`, a text string, ``{"tool": name, "arguments": {...}}``, ``{"text": ...}`` or
``{"tool_calls": [...], "content": ...}``; :func:`shell_call` builds the call of whatever
shell tool the harness offers.

Token usage is estimated as characters / 4. Every request is recorded in ``requests``.
A streamed reply of a responder starts (role chunk, ``response.created``) before the
responder is asked; a responder that fails then ends the stream with an error event.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import attrs

from . import openai_wire as wire
from ._http_server import BackgroundServer, Handler
from .llm import INSTANCE_ID_HEADER

__all__ = [
    "SHELL_TOOL_NAMES",
    "ChatRequest",
    "ReplyLike",
    "RequestRecord",
    "Responder",
    "Script",
    "ScriptedModelServer",
    "Step",
    "ToolCall",
    "message_text",
    "shell_call",
]

CHAT = "chat"
RESPONSES = "responses"


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
    """What a responder sees of one model request, chat completions or Responses API."""

    body: dict[str, Any]
    headers: dict[str, str]
    key: str | None
    """The registered key the conversation matched (None for the default responder)."""
    api: str = CHAT
    """``"chat"`` or ``"responses"``."""
    conversation: list[dict[str, Any]] | None = attrs.field(default=None, repr=False)
    """The conversation as chat messages (None: the body's ``messages``)."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation as chat messages (a Responses request's items converted)."""
        if self.conversation is not None:
            return self.conversation
        return [m for m in self.body.get("messages") or [] if isinstance(m, dict)]

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools offered, as ``{"type", "name", "description", "parameters"}``."""
        return wire.tool_specs(self.body.get("tools"))

    @property
    def tool_names(self) -> list[str]:
        """Names of the tools offered."""
        return [t["name"] for t in self.tools]

    @property
    def step(self) -> int:
        """Assistant turns already in the conversation (the index of the reply asked for)."""
        return sum(1 for m in self.messages if m.get("role") == "assistant")


ReplyLike = Step | str | Mapping[str, Any]
Responder = Callable[[ChatRequest], ReplyLike]
ScriptLike = Script | Sequence[ReplyLike] | Responder


@attrs.define
class RequestRecord:
    """What the server saw of one model request (for tests)."""

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
    api: str = CHAT
    """``"chat"`` or ``"responses"``."""
    path: str = ""
    """The request path (with any prefix before ``/v1/``)."""
    stream: bool = False


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a message's ``content`` (string, or the text parts of a list)."""
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return wire.content_text(content)


def _count_tokens(text: str) -> int:
    return max(1, len(text) // 4)


# ---------------------------------------------------------------- shell_call

SHELL_TOOL_NAMES: tuple[str, ...] = (
    "exec",
    "bash",
    "shell",
    "exec_command",
    "shell_command",
    "local_shell",
    "run_command",
    "run_shell_command",
    "execute_command",
    "terminal",
)
"""Names of shell-like tools, in order of preference."""
_COMMAND_KEYS = ("command", "cmd", "script", "commands")


def _is_shell_like(name: str) -> bool:
    return any(word in name.lower() for word in ("shell", "bash", "exec", "command", "terminal"))


def _types(schema: Mapping[str, Any]) -> list[str]:
    kind = schema.get("type")
    return [str(k) for k in kind] if isinstance(kind, list) else [str(kind or "")]


def _default_value(name: str, schema: Mapping[str, Any], command: str) -> Any:
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    kinds = _types(schema)
    lowered = name.lower()
    if "string" in kinds:
        if "dir" in lowered or lowered in ("cwd", "path", "directory"):
            return "."
        return command if "desc" in lowered else ""
    if "integer" in kinds or "number" in kinds:
        if "timeout" in lowered or "yield" in lowered:
            return 120000 if "ms" in lowered else 120
        return int(schema.get("minimum") or 0)
    if "boolean" in kinds:
        return False
    if "array" in kinds:
        return []
    return {} if "object" in kinds else None


def _shell_arguments(spec: Mapping[str, Any], command: str) -> dict[str, Any]:
    params = spec.get("parameters") or {}
    properties: Mapping[str, Any] = params.get("properties") or {}
    required = [str(r) for r in params.get("required") or []]
    key = next((k for k in _COMMAND_KEYS if k in properties), None)
    if key is None:
        key = next((k for k in required if "string" in _types(properties.get(k) or {})), None)
    if key is None:
        raise ValueError(
            f"the tool {spec['name']!r} has no command argument: "
            f"its parameters are {sorted(properties)}"
        )
    value: Any = command
    if "array" in _types(properties[key]) and "string" not in _types(properties[key]):
        value = ["bash", "-lc", command]
    arguments: dict[str, Any] = {key: value}
    for name in required:
        if name not in arguments:
            arguments[name] = _default_value(name, properties.get(name) or {}, command)
    return arguments


def shell_call(request: ChatRequest, command: str, content: str = "") -> Step:
    """A reply that runs ``command`` with the shell-like tool among the request's tools.

    The tool is picked by name (:data:`SHELL_TOOL_NAMES` in order, then any name with
    shell/bash/exec/command/terminal in it); its arguments come from its JSON schema: the
    ``command``/``cmd``/``script`` property (or the first required string) gets ``command``,
    as ``["bash", "-lc", command]`` when it is an array; other required properties get their
    ``default``, first ``enum`` value or a plain value by name and type (a directory ``.``,
    a timeout 120 s, a description the command itself). Codex's built-in ``local_shell``
    tool gets a ``local_shell_call`` action. Raises ``ValueError`` naming the tools offered
    when none is shell-like.
    """
    specs = {spec["name"]: spec for spec in request.tools}
    name = next((n for n in SHELL_TOOL_NAMES if n in specs), None)
    name = name or next((n for n in specs if _is_shell_like(n)), None)
    if name is None:
        raise ValueError(f"no shell-like tool among the request's tools: {sorted(specs)}")
    spec = specs[name]
    if spec["type"] == "local_shell":
        action = {"type": "exec", "command": ["bash", "-lc", command], "env": {}}
        return Step(content=content, tool_calls=(ToolCall(name, action),))
    return Step(content=content, tool_calls=(ToolCall(name, _shell_arguments(spec, command)),))


# ---------------------------------------------------------------- the server


class _Failure(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@attrs.define
class _Call:
    """One model request being answered."""

    request: ChatRequest
    record: RequestRecord
    serial: int
    created: int
    reply: Callable[[], Step]


class ScriptedModelServer(BackgroundServer):
    """OpenAI-compatible model server replaying registered scripts (see the module doc).

    Use as a context manager (or :meth:`start` / :meth:`stop`); ``base_url`` ends in ``/v1``.
    """

    _thread_name = "scripted-model"

    def __init__(self, model_name: str = "scripted") -> None:
        super().__init__()
        self.model_name = model_name
        self._scripts: dict[str, Script | Responder] = {}
        self._default: Responder | None = None
        self._lock = threading.Lock()
        self.requests: list[RequestRecord] = []
        self._counter = 0
        self._history: dict[str, list[dict[str, Any]]] = {}

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

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Bound(_ModelHandler):
            scripted = server

        return Bound

    # ------------------------------------------------------------ answering

    def models(self) -> dict[str, Any]:
        """The ``/v1/models`` answer."""
        return {
            "object": "list",
            "data": [{"id": self.model_name, "object": "model", "owned_by": "orchard"}],
        }

    def _begin(self, api: str, body: Any, headers: dict[str, str], path: str) -> _Call:
        """Match the conversation and fix its reply (a script's now; a responder's later)."""
        if not isinstance(body, dict):
            raise _Failure(400, "the request body is not a JSON object")
        if api == CHAT:
            if not isinstance(body.get("messages"), list):
                raise _Failure(400, "the request has no `messages` list")
            conversation = [m for m in body["messages"] if isinstance(m, dict)]
        else:
            if not isinstance(body.get("input"), str | list):
                raise _Failure(400, "the request has no `input` (a string or a list of items)")
            with self._lock:
                history = self._history.get(str(body.get("previous_response_id") or ""), [])
            conversation = wire.responses_conversation(body, history)
        key = self._match(headers.get(INSTANCE_ID_HEADER.lower()), conversation)
        request = ChatRequest(body, headers, key, api, conversation)
        record = RequestRecord(
            key,
            request.step,
            len(conversation),
            request.tool_names,
            200,
            headers.get("authorization"),
            body,
            api,
            path,
            bool(body.get("stream")),
        )
        with self._lock:
            entry = self._scripts.get(key) if key is not None else self._default
            known = sorted(self._scripts)
            self._counter += 1
            serial = self._counter
        call = _Call(request, record, serial, int(time.time()), lambda: Step())
        try:
            call.reply = self._replier(entry, request, known)
        except _Failure as failure:
            self._finish(call, failure.status)
            raise
        return call

    def _replier(
        self, entry: Script | Responder | None, request: ChatRequest, known: list[str]
    ) -> Callable[[], Step]:
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
            return lambda: step
        return lambda: Step.coerce(entry(request))

    def _finish(self, call: _Call, status: int) -> None:
        call.record.status = status
        with self._lock:
            self.requests.append(call.record)

    def _answer(self, call: _Call, step: Step) -> dict[str, Any]:
        if call.request.api == CHAT:
            return self._completion(call, step)
        response = self._response(call, step)
        with self._lock:
            self._history[response["id"]] = [
                *(m for m in call.request.messages if m.get("role") != "system"),
                wire.responses_reply(response),
            ]
        return response

    def _usage(self, prompt: Any, step: Step) -> tuple[int, int]:
        completion = (step.content or "") + "".join(c.arguments_json() for c in step.tool_calls)
        return _count_tokens(json.dumps(prompt)), _count_tokens(completion)

    def _completion(self, call: _Call, step: Step) -> dict[str, Any]:
        body = call.request.body
        message: dict[str, Any] = {"role": "assistant", "content": step.content or None}
        if step.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{call.serial}_{i}",
                    "type": "function",
                    "function": {"name": tc.name, "arguments": tc.arguments_json()},
                }
                for i, tc in enumerate(step.tool_calls)
            ]
        elif message["content"] is None:
            message["content"] = ""
        prompt_tokens, completion_tokens = self._usage(body.get("messages"), step)
        return {
            "id": f"chatcmpl-scripted-{call.serial}",
            "object": "chat.completion",
            "created": call.created,
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

    def _response(self, call: _Call, step: Step) -> dict[str, Any]:
        body = call.request.body
        serial = call.serial
        output: list[dict[str, Any]] = []
        if step.content or not step.tool_calls:
            text = {"type": "output_text", "text": step.content, "annotations": []}
            output.append(
                {
                    "id": f"msg_scripted_{serial}",
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [text],
                }
            )
        builtin = {t["type"] for t in call.request.tools}
        for i, tc in enumerate(step.tool_calls):
            if tc.name == "local_shell" and "local_shell" in builtin:
                action = tc.arguments if isinstance(tc.arguments, Mapping) else {}
                item: dict[str, Any] = {"id": f"lsh_scripted_{serial}_{i}"}
                item |= {"type": "local_shell_call", "action": dict(action)}
            else:
                item = {"id": f"fc_scripted_{serial}_{i}", "type": "function_call"}
                item |= {"name": tc.name, "arguments": tc.arguments_json()}
            output.append(item | {"call_id": f"call_{serial}_{i}", "status": "completed"})
        input_tokens, output_tokens = self._usage(
            [body.get("instructions"), body.get("input")], step
        )
        return {
            "id": f"resp_scripted_{serial}",
            "object": "response",
            "created_at": call.created,
            "status": "completed",
            "error": None,
            "incomplete_details": None,
            "model": str(body.get("model") or self.model_name),
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": body.get("previous_response_id"),
            "tool_choice": body.get("tool_choice", "auto"),
            "usage": {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + output_tokens,
            },
        }

    def _events(self, call: _Call, answer: Mapping[str, Any]) -> list[bytes]:
        """The SSE events of ``answer`` (chat chunks and ``[DONE]``, or Responses events)."""
        if call.request.api == RESPONSES:
            return [wire.sse_bytes(e, e["type"]) for e in wire.responses_events(answer)]
        options = call.request.body.get("stream_options")
        usage = bool(isinstance(options, dict) and options.get("include_usage"))
        chunks = [wire.sse_bytes(chunk) for chunk in wire.chat_chunks(answer, usage)]
        return [*chunks, wire.sse_bytes("[DONE]")]

    def _prelude(self, call: _Call) -> list[bytes]:
        """The events sent before the reply is known (chat: the role chunk; Responses:
        ``response.created`` and ``response.in_progress``)."""
        if call.request.api == RESPONSES:
            return self._events(call, self._response(call, Step()))[:2]
        return self._events(call, self._completion(call, Step()))[:1]

    def _stream_error(self, call: _Call, message: str) -> bytes:
        error = {"message": message, "type": "server_error", "code": "responder_failed"}
        if call.request.api == CHAT:
            return wire.sse_bytes({"error": error}) + wire.sse_bytes("[DONE]")
        failed = self._response(call, Step()) | {"status": "failed", "output": [], "error": error}
        return wire.sse_bytes(
            {"type": "response.failed", "sequence_number": 2, "response": failed},
            "response.failed",
        )


class _ModelHandler(Handler):
    scripted: ScriptedModelServer

    def _route(self) -> str:
        path = urlsplit(self.path).path.rstrip("/")
        for route in ("/chat/completions", "/responses", "/models"):
            if path.endswith(route):
                return route
        return ""

    def do_GET(self) -> None:
        if self._route() == "/models":
            self.send_json(200, self.scripted.models())
        else:
            self.send_error_json(404, f"no route {self.path}")

    def do_POST(self) -> None:
        raw = self.read_body()
        if raw is None:
            return
        route = self._route()
        if route not in ("/chat/completions", "/responses"):
            self.send_error_json(404, f"no route {self.path}")
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self.send_error_json(400, "the request body is not JSON")
            return
        api = CHAT if route == "/chat/completions" else RESPONSES
        headers = {k.lower(): v for k, v in self.headers.items()}
        server = self.scripted
        try:
            call = server._begin(api, body, headers, self.path)
        except _Failure as failure:
            self.send_error_json(failure.status, str(failure))
            return
        if body.get("stream"):
            self._stream(call)
            return
        try:
            answer = server._answer(call, call.reply())
        except Exception as exc:  # a responder's bug: answer it, do not hang the client
            server._finish(call, 500)
            self.send_error_json(500, f"the responder failed: {type(exc).__name__}: {exc}")
            return
        server._finish(call, 200)
        self.send_json(200, answer)

    def _stream(self, call: _Call) -> None:
        server = self.scripted
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        self.start_stream(200, headers)
        prelude = server._prelude(call)
        for event in prelude:
            self.write_chunk(event)
        try:
            answer = server._answer(call, call.reply())
        except Exception as exc:
            server._finish(call, 500)
            message = f"the responder failed: {type(exc).__name__}: {exc}"
            self.write_chunk(server._stream_error(call, message))
            self.end_stream()
            return
        server._finish(call, 200)
        for event in server._events(call, answer)[len(prelude) :]:
            self.write_chunk(event)
        self.end_stream()

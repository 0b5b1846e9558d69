"""A scripted OpenAI-compatible model server, for testing harnesses without a model.

:class:`ScriptedModelServer` serves ``POST /v1/chat/completions`` and ``GET /v1/models``
on 127.0.0.1 (a free port, a background thread). Each conversation is matched to a
registered :class:`Script` by its instance id: the ``X-Orchard-Instance-Id`` header the
harnesses send, else the registered id that occurs in the conversation's messages. The
step replayed is the number of assistant messages in the request. A step is a text reply
(mini-swe-agent's text-based configs: a fenced ``mswea_bash_command`` block) and/or tool
calls (the tools harness, or mini's tool-calling config).

Script builders: :func:`gold_script` (apply a known patch, then submit), :func:`empty_script`
(submit at once), :func:`junk_script` (never act) and :func:`from_trajectory` (replay a
recorded trajectory's assistant turns).
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import types
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import attrs
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .model import INSTANCE_ID_HEADER
from .trajectory import Trajectory

__all__ = [
    "MINI_SUBMIT_COMMAND",
    "RequestRecord",
    "Script",
    "ScriptedModelServer",
    "Step",
    "ToolCall",
    "empty_script",
    "from_trajectory",
    "gold_script",
    "junk_script",
    "mini_action",
]

Harness = Literal["tools", "mini"]

MINI_SUBMIT_COMMAND: Final = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff"
"""How a scripted mini episode submits (mini's sentinel, then the diff as submission)."""

GOLD_PATCH_PATH: Final = "/tmp/orchard_gold.patch"


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


ScriptLike = Script | Sequence[Step | str | Mapping[str, Any]]


def _as_script(script: ScriptLike) -> Script:
    if isinstance(script, Script):
        return script
    return Script([Step.coerce(s) for s in script])


# ---------------------------------------------------------------- builders


def mini_action(command: str, thought: str = "I will run the next command.") -> str:
    """A reply in the format of mini's text-based configs (one ``mswea_bash_command`` block)."""
    return f"THOUGHT: {thought}\n\n```mswea_bash_command\n{command}\n```"


def _heredoc_write(path: str, text: str) -> str:
    """A command writing ``text`` to ``path`` via a quoted heredoc (base64 if need be)."""
    if not text.endswith("\n"):
        text += "\n"
    writer, body = "cat", text
    if "```" in text:  # would end mini's fenced block early: carry it as base64
        writer, body = "base64 -d", base64.encodebytes(text.encode("utf-8")).decode("ascii")
    marker = "ORCHARD_PATCH_EOF"
    lines = set(body.splitlines())
    while marker in lines:
        marker += "_X"
    return f"{writer} > {path} <<'{marker}'\n{body}{marker}"


def _action_step(harness: Harness, command: str, thought: str, toolcalls: bool) -> Step:
    if toolcalls:
        return Step(content=thought, tool_calls=(ToolCall("bash", {"command": command}),))
    return Step(content=mini_action(command, thought))


def _submit_step(harness: Harness, toolcalls: bool) -> Step:
    thought = "The change is complete; submitting."
    if harness == "tools":
        return Step(content=thought, tool_calls=(ToolCall("submit", {}),))
    return _action_step(harness, MINI_SUBMIT_COMMAND, thought, toolcalls)


def _toolcalls(harness: Harness, toolcalls: bool | None) -> bool:
    if harness not in ("tools", "mini"):
        raise ValueError(f"unknown harness {harness!r} (use 'tools' or 'mini')")
    return harness == "tools" if toolcalls is None else toolcalls


def gold_script(patch: str, harness: Harness, *, toolcalls: bool | None = None) -> Script:
    """Write ``patch`` to a file with a quoted heredoc, ``git apply`` it, then submit.

    ``toolcalls`` picks the reply format (default: tool calls for ``"tools"``, text for
    ``"mini"``; set it for mini's tool-calling config). Commands run in the repository
    (both harnesses start commands there).
    """
    use_tools = _toolcalls(harness, toolcalls)
    return Script(
        [
            _action_step(
                harness, _heredoc_write(GOLD_PATCH_PATH, patch), "Writing the fix.", use_tools
            ),
            _action_step(harness, f"git apply {GOLD_PATCH_PATH}", "Applying it.", use_tools),
            _submit_step(harness, use_tools),
        ]
    )


def empty_script(harness: Harness, *, toolcalls: bool | None = None) -> Script:
    """Submit at once, changing nothing."""
    use_tools = _toolcalls(harness, toolcalls)
    if harness == "tools":
        return Script([_submit_step(harness, use_tools)])
    return Script(
        [_action_step(harness, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "Done.", use_tools)]
    )


def junk_script(text: str = "I am not sure what to do. Let me think about it more.") -> Script:
    """A model that never acts: the same reply without a tool call or code block, forever."""
    return Script([Step(content=text)], repeat_last=True)


def from_trajectory(traj: Trajectory) -> Script:
    """Replay a recorded trajectory: one step per assistant message, text and tool calls."""
    steps = []
    for message in traj.assistant_messages():
        content = message.get("content")
        calls = tuple(
            ToolCall(
                str(call.get("function", {}).get("name", "")),
                str(call.get("function", {}).get("arguments", "")),
            )
            for call in message.get("tool_calls") or ()
        )
        steps.append(Step(content=content if isinstance(content, str) else "", tool_calls=calls))
    return Script(steps)


# ---------------------------------------------------------------- server


def _count_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


@attrs.define
class RequestRecord:
    """What the server saw of one chat request (for tests)."""

    instance_id: str | None
    step: int
    n_messages: int
    tools: list[str]
    status: int
    authorization: str | None = None
    """The ``Authorization`` header sent (this is a test server: it checks no keys)."""


class ScriptedModelServer:
    """OpenAI-compatible chat server replaying registered scripts (see the module doc).

    Use as a context manager (or :meth:`start` / :meth:`stop`); ``base_url`` ends in
    ``/v1``. Token usage is estimated as characters / 4.
    """

    def __init__(self, model_name: str = "scripted") -> None:
        self.model_name = model_name
        self._scripts: dict[str, Script] = {}
        self._lock = threading.Lock()
        self.requests: list[RequestRecord] = []
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None
        self._sock: socket.socket | None = None
        self._counter = 0

    # ------------------------------------------------------------ scripts

    def add(self, instance_id: str, script: ScriptLike) -> None:
        """Register (or replace) the script of conversations about ``instance_id``."""
        with self._lock:
            self._scripts[instance_id] = _as_script(script)

    def remove(self, instance_id: str) -> None:
        """Forget the script of ``instance_id``."""
        with self._lock:
            self._scripts.pop(instance_id, None)

    def _match(self, header: str | None, messages: Sequence[Mapping[str, Any]]) -> str | None:
        with self._lock:
            if header and header in self._scripts:
                return header
            ids = sorted(self._scripts, key=len, reverse=True)
        text = "\n".join(_message_text(m) for m in messages if isinstance(m, Mapping))
        return next((i for i in ids if i in text), None)

    # ------------------------------------------------------------ lifetime

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``."""
        if self._port is None:
            raise RuntimeError("the server is not running")
        return f"http://127.0.0.1:{self._port}/v1"

    def start(self, timeout: float = 30) -> None:
        """Start serving in a background thread; returns once it accepts connections."""
        if self._thread is not None:
            raise RuntimeError("the server is already running")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self._port = int(sock.getsockname()[1])
        self._sock = sock
        config = uvicorn.Config(self._app(), log_level="warning", lifespan="off", access_log=False)
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="scripted-model", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the scripted model server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._server = None
        self._thread = None
        self._port = None

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

    # ------------------------------------------------------------ HTTP

    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    async def _models(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": self.model_name, "object": "model", "owned_by": "orchard"}],
            }
        )

    def _error(self, status: int, message: str, record: RequestRecord | None) -> JSONResponse:
        if record is not None:
            record.status = status
            with self._lock:
                self.requests.append(record)
        body = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
        return JSONResponse(body, status_code=status)

    async def _chat(self, request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return self._error(400, "the request body is not JSON", None)
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list):
            return self._error(400, "the request has no `messages` list", None)
        tools = [
            str(t["function"].get("name", ""))
            for t in body.get("tools") or []
            if isinstance(t, dict) and isinstance(t.get("function"), dict)
        ]
        step_index = sum(
            1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant"
        )
        instance_id = self._match(request.headers.get(INSTANCE_ID_HEADER), messages)
        record = RequestRecord(
            instance_id,
            step_index,
            len(messages),
            tools,
            200,
            request.headers.get("authorization"),
        )
        if instance_id is None:
            with self._lock:
                known = sorted(self._scripts)
            return self._error(
                400,
                "unknown conversation: no registered instance id in the "
                f"{INSTANCE_ID_HEADER} header or the messages (registered: {known})",
                record,
            )
        with self._lock:
            script = self._scripts[instance_id]
            self._counter += 1
            serial = self._counter
        step = script.step(step_index)
        if step is None:
            return self._error(
                400,
                f"the script of {instance_id!r} has {len(script.steps)} steps; "
                f"step {step_index} was requested",
                record,
            )
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
        prompt_tokens = _count_tokens(json.dumps(messages))
        completion_tokens = _count_tokens(
            (step.content or "") + "".join(c.arguments_json() for c in step.tool_calls)
        )
        with self._lock:
            self.requests.append(record)
        return JSONResponse(
            {
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
        )

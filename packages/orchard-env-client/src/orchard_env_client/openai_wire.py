"""The OpenAI wire shapes the scripted model and the recording proxy speak (stdlib only).

Two APIs: chat completions (``/v1/chat/completions``, streamed as ``chat.completion.chunk``
objects ending in ``data: [DONE]``) and the Responses API (``/v1/responses``, streamed as
typed events ``response.created`` ... ``response.completed``). This module converts between
them and our chat-shaped conversation:

- :func:`responses_conversation`: a Responses request's ``instructions`` + ``input`` items as
  chat messages (``developer`` becomes ``system``; ``function_call`` items become the
  ``tool_calls`` of an assistant message; ``function_call_output`` a ``tool`` message;
  reasoning items are dropped);
- :func:`responses_reply`: a response's ``output`` items as one chat assistant message;
- :func:`chat_chunks` / :func:`responses_events`: a complete answer cut into stream pieces;
- :class:`ChatStreamAssembler` / :class:`ResponsesStreamAssembler`: stream pieces put back
  together into the complete (non-streaming) answer;
- :class:`SSEParser`: server-sent events out of a byte stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "ChatStreamAssembler",
    "ResponsesStreamAssembler",
    "SSEEvent",
    "SSEParser",
    "chat_chunks",
    "chat_tools",
    "content_text",
    "responses_conversation",
    "responses_events",
    "responses_reply",
    "sse_bytes",
    "token_ids_of",
    "tool_specs",
    "usage_of",
]

_PIECE = 16
"""Characters per streamed text or arguments fragment."""


def content_text(content: Any) -> str:
    """The text of a ``content`` value: a string, or the text parts of a list (any API)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def _pieces(text: str) -> list[str]:
    return [text[i : i + _PIECE] for i in range(0, len(text), _PIECE)]


# ---------------------------------------------------------------- tools


def tool_specs(tools: Any) -> list[dict[str, Any]]:
    """Tools of either API as ``{"type", "name", "description", "parameters"}`` dicts.

    Chat tools are ``{"type": "function", "function": {name, parameters}}``; Responses tools
    carry ``name``/``parameters`` at the top (and built-ins such as ``{"type": "local_shell"}``
    have only a type, which becomes the name).
    """
    out: list[dict[str, Any]] = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, Mapping):
            continue
        kind = str(tool.get("type") or "function")
        inner = tool.get("function")
        spec: Mapping[str, Any] = inner if isinstance(inner, Mapping) else tool
        out.append(
            {
                "type": kind,
                "name": str(spec.get("name") or kind),
                "description": str(spec.get("description") or ""),
                "parameters": dict(spec.get("parameters") or {}),
            }
        )
    return out


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    """Tools of either API in the chat shape ``{"type": "function", "function": {...}}``."""
    return [
        {
            "type": "function",
            "function": {
                "name": spec["name"],
                "description": spec["description"],
                "parameters": spec["parameters"],
            },
        }
        for spec in tool_specs(tools)
    ]


# ---------------------------------------------------------------- Responses -> chat


def _chat_content(content: Any) -> str | list[dict[str, Any]]:
    if not isinstance(content, list):
        return content_text(content)
    parts: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind in ("input_image", "image_url"):
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, Mapping) else url
            parts.append({"type": "image_url", "image_url": {"url": str(url or "")}})
        elif "text" in part:
            parts.append({"type": "text", "text": str(part["text"])})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _output_text(output: Any) -> str:
    return output if isinstance(output, str) else content_text(output)


def _tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {
        "id": str(call_id or ""),
        "type": "function",
        "function": {"name": str(name or ""), "arguments": arguments},
    }


def _item_call(item: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = item.get("type")
    call_id = item.get("call_id") or item.get("id")
    if kind == "function_call":
        return _tool_call(call_id, item.get("name"), item.get("arguments") or "")
    if kind == "custom_tool_call":
        return _tool_call(call_id, item.get("name"), str(item.get("input") or ""))
    if kind == "local_shell_call":
        return _tool_call(call_id, "local_shell", item.get("action") or {})
    return None


def _append_call(messages: list[dict[str, Any]], call: dict[str, Any]) -> None:
    last = messages[-1] if messages else None
    if last is not None and last.get("role") == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _items_to_messages(items: Sequence[Any], messages: list[dict[str, Any]]) -> None:
    for item in items:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type") or ("message" if "role" in item else None)
        call = _item_call(item)
        if call is not None:
            _append_call(messages, call)
        elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(item.get("call_id") or item.get("id") or ""),
                    "content": _output_text(item.get("output")),
                }
            )
        elif kind == "message":
            role = str(item.get("role") or "user")
            messages.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": _chat_content(item.get("content")),
                }
            )


def responses_conversation(
    body: Mapping[str, Any], history: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """A Responses request as chat messages (see the module doc).

    ``history`` is the conversation behind ``previous_response_id`` when the caller knows
    it (chat messages, prepended after the instructions).
    """
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    messages.extend(dict(m) for m in history if m.get("role") != "system" or not messages)
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        _items_to_messages(items, messages)
    return messages


def responses_reply(response: Mapping[str, Any]) -> dict[str, Any]:
    """A response's ``output`` items as one chat assistant message."""
    messages: list[dict[str, Any]] = [{"role": "assistant", "content": None}]
    text: list[str] = []
    for item in response.get("output") or []:
        if not isinstance(item, Mapping):
            continue
        call = _item_call(item)
        if call is not None:
            _append_call(messages, call)
        elif item.get("type") == "message":
            text.append(content_text(item.get("content")))
    reply = messages[0]
    reply["content"] = "".join(text) if text or "tool_calls" not in reply else None
    return reply


# ---------------------------------------------------------------- usage and token ids


def usage_of(response: Any) -> dict[str, int] | None:
    """``{"prompt_tokens", "completion_tokens", "total_tokens"}`` of a chat or Responses
    answer (None when it carries no usage)."""
    usage = response.get("usage") if isinstance(response, Mapping) else None
    if not isinstance(usage, Mapping):
        return None
    prompt = int(usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0)
    completion = int(usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0)
    total = int(usage.get("total_tokens", prompt + completion) or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}


def token_ids_of(response: Any) -> dict[str, Any] | None:
    """Token ids an inference server returned with an answer (vLLM's ``prompt_token_ids``
    and per-choice ``token_ids``, chat ``logprobs``): ``{"prompt_ids", "completion_ids",
    "logprobs"}``, or None when there are none."""
    if not isinstance(response, Mapping):
        return None
    choices = response.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], Mapping) else {}
    prompt = response.get("prompt_token_ids") or choice.get("prompt_token_ids")
    completion = choice.get("token_ids") or response.get("token_ids")
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    values = [float(t["logprob"]) for t in content or [] if isinstance(t, Mapping)]
    if not (prompt or completion or values):
        return None
    return {
        "prompt_ids": [int(t) for t in prompt or []],
        "completion_ids": [int(t) for t in completion or []],
        "logprobs": values or None,
    }


# ---------------------------------------------------------------- server-sent events


@attrs.define(frozen=True)
class SSEEvent:
    """One server-sent event: its ``event`` name (None when unnamed) and ``data`` text."""

    event: str | None
    data: str

    def json(self) -> Any:
        """``data`` parsed as JSON (None for ``[DONE]`` or text that is not JSON)."""
        try:
            return json.loads(self.data)
        except ValueError:
            return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"event": self.event, "data": self.data}


def sse_bytes(data: Any, event: str | None = None) -> bytes:
    """One event in SSE framing; ``data`` is JSON-encoded unless it is a string."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    body = "".join(f"data: {line}\n" for line in text.split("\n"))
    return (head + body + "\n").encode("utf-8")


class SSEParser:
    """Incremental SSE parser: :meth:`feed` bytes as they arrive, get whole events back."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events completed by ``chunk``."""
        self._buffer += chunk
        events: list[SSEEvent] = []
        while True:
            cut = self._buffer.find(b"\n")
            if cut < 0:
                return events
            raw, self._buffer = self._buffer[:cut], self._buffer[cut + 1 :]
            line = raw.rstrip(b"\r").decode("utf-8", "replace")
            if not line:
                if self._data:
                    events.append(SSEEvent(self._event, "\n".join(self._data)))
                self._event, self._data = None, []
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "event":
                    self._event = value
                elif name == "data":
                    self._data.append(value)

    def close(self) -> list[SSEEvent]:
        """The last event when the stream ended without a blank line."""
        events = self.feed(b"\n\n") if self._buffer or self._data else []
        return events


# ---------------------------------------------------------------- chat completions stream


def chat_chunks(completion: Mapping[str, Any], include_usage: bool) -> Iterator[dict[str, Any]]:
    """A ``chat.completion`` cut into ``chat.completion.chunk`` objects: a role chunk, text
    pieces, per tool call a chunk with its index/id/name then argument fragments, the
    ``finish_reason`` chunk and, with ``include_usage``, a last chunk with ``choices: []``."""
    head = {
        "id": completion.get("id"),
        "object": "chat.completion.chunk",
        "created": completion.get("created"),
        "model": completion.get("model"),
    }
    extra = {"usage": None} if include_usage else {}
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return (
            head
            | {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            | extra
        )

    yield chunk({"role": "assistant", "content": ""})
    for piece in _pieces(str(message.get("content") or "")):
        yield chunk({"content": piece})
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        opening = {"name": function.get("name"), "arguments": ""}
        yield chunk(
            {
                "tool_calls": [
                    {"index": index, "id": call.get("id"), "type": "function", "function": opening}
                ]
            }
        )
        for piece in _pieces(str(function.get("arguments") or "")):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, str(choice.get("finish_reason") or "stop"))
    if include_usage:
        yield head | {"choices": [], "usage": completion.get("usage")}


class ChatStreamAssembler:
    """Chat chunks put back together into one ``chat.completion`` (first choice)."""

    def __init__(self) -> None:
        self._head: dict[str, Any] = {}
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish: str | None = None
        self._usage: Any = None
        self._prompt_ids: list[int] = []
        self._completion_ids: list[int] = []
        self._logprobs: list[Any] = []

    def add(self, chunk: Any) -> None:
        """Take one parsed chunk (anything else is ignored)."""
        if not isinstance(chunk, Mapping):
            return
        for key in ("id", "created", "model", "system_fingerprint"):
            if chunk.get(key) is not None:
                self._head.setdefault(key, chunk[key])
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        self._prompt_ids.extend(chunk.get("prompt_token_ids") or [])
        for choice in chunk.get("choices") or []:
            if isinstance(choice, Mapping) and int(choice.get("index") or 0) == 0:
                self._add_choice(choice)

    def _add_choice(self, choice: Mapping[str, Any]) -> None:
        delta = choice.get("delta") or {}
        self._content.append(str(delta.get("content") or ""))
        self._reasoning.append(str(delta.get("reasoning_content") or delta.get("reasoning") or ""))
        for call in delta.get("tool_calls") or []:
            slot = self._calls.setdefault(
                int(call.get("index") or 0),
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            slot["id"] = call.get("id") or slot["id"]
            function = call.get("function") or {}
            slot["function"]["name"] += str(function.get("name") or "")
            slot["function"]["arguments"] += str(function.get("arguments") or "")
        self._finish = choice.get("finish_reason") or self._finish
        self._prompt_ids.extend(choice.get("prompt_token_ids") or [])
        self._completion_ids.extend(choice.get("token_ids") or [])
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, Mapping):
            self._logprobs.extend(logprobs.get("content") or [])

    def result(self) -> dict[str, Any]:
        """The complete answer, in the non-streaming shape."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._content)}
        if any(self._reasoning):
            message["reasoning_content"] = "".join(self._reasoning)
        if self._calls:
            message["tool_calls"] = [self._calls[i] for i in sorted(self._calls)]
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": self._finish}
        if self._logprobs:
            choice["logprobs"] = {"content": self._logprobs}
        if self._completion_ids:
            choice["token_ids"] = self._completion_ids
        out = {"object": "chat.completion", **self._head, "choices": [choice]}
        if self._usage is not None:
            out["usage"] = self._usage
        if self._prompt_ids:
            out["prompt_token_ids"] = self._prompt_ids
        return out


# ---------------------------------------------------------------- Responses stream


def responses_events(response: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """A complete Responses-API ``response`` as its stream events (``type`` in each;
    ``sequence_number`` counted from 0): created, in_progress, per output item added →
    deltas → done, completed."""
    sequence = iter(range(1 << 62))
    pending = dict(response) | {"status": "in_progress", "output": [], "usage": None}

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "sequence_number": next(sequence), **fields}

    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    for index, item in enumerate(response.get("output") or []):
        yield from _item_events(event, index, item)
    yield event("response.completed", response=dict(response))


def _item_events(event: Any, index: int, item: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    item_id = item.get("id")
    kind = item.get("type")
    if kind == "message":
        yield event(
            "response.output_item.added",
            output_index=index,
            item=dict(item) | {"status": "in_progress", "content": []},
        )
        for part_index, part in enumerate(item.get("content") or []):
            where = {"item_id": item_id, "output_index": index, "content_index": part_index}
            text = str(part.get("text") or "")
            yield event("response.content_part.added", **where, part=dict(part) | {"text": ""})
            for piece in _pieces(text):
                yield event("response.output_text.delta", **where, delta=piece, logprobs=[])
            yield event("response.output_text.done", **where, text=text, logprobs=[])
            yield event("response.content_part.done", **where, part=dict(part))
    elif kind == "function_call":
        yield event(
            "response.output_item.added",
            output_index=index,
            item=dict(item) | {"status": "in_progress", "arguments": ""},
        )
        arguments = str(item.get("arguments") or "")
        where = {"item_id": item_id, "output_index": index}
        for piece in _pieces(arguments):
            yield event("response.function_call_arguments.delta", **where, delta=piece)
        yield event("response.function_call_arguments.done", **where, arguments=arguments)
    else:
        yield event("response.output_item.added", output_index=index, item=dict(item))
    yield event("response.output_item.done", output_index=index, item=dict(item))


class ResponsesStreamAssembler:
    """Responses stream events put back together into the final ``response`` object: the
    one ``response.completed`` (or ``.incomplete`` / ``.failed``) carries, else one built
    from the ``response.created`` head and the ``output_item.done`` items."""

    def __init__(self) -> None:
        self._final: dict[str, Any] | None = None
        self._head: dict[str, Any] = {}
        self._items: dict[int, Any] = {}
        self._error: Any = None

    def add(self, event: Any) -> None:
        """Take one parsed event (anything else is ignored)."""
        if not isinstance(event, Mapping):
            return
        kind = event.get("type")
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            self._final = dict(event.get("response") or {})
        elif kind in ("response.created", "response.in_progress"):
            self._head = dict(event.get("response") or {})
        elif kind == "response.output_item.done":
            self._items[int(event.get("output_index") or 0)] = event.get("item")
        elif kind == "error":
            self._error = {k: v for k, v in event.items() if k not in ("type", "sequence_number")}

    def result(self) -> dict[str, Any]:
        """The final response (``status: "incomplete"`` when the stream stopped early)."""
        if self._final is not None:
            return self._final
        out = self._head | {
            "status": "failed" if self._error else "incomplete",
            "output": [self._items[i] for i in sorted(self._items)],
        }
        if self._error:
            out["error"] = self._error
        return out

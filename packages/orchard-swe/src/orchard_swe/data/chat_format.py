"""OpenAI chat requests as a chat template can render them, and tool calls back from text.

What the tiny LLM server (:mod:`orchard_swe.testing.tiny_llm_server`) does to a request
before it renders the prompt, and what SFT data (:mod:`orchard_swe.data.sft_data`) does to a
trajectory's messages so they are tokenized the same way: :func:`prepare_messages` validates
OpenAI messages and flattens what the template cannot render (:class:`TemplateCaps`, guessed
from the template's source) into Hermes/Qwen-style text (``<tool_call>`` and
``<tool_response>`` blocks, the tool signatures in the system prompt);
:func:`parse_tool_calls` reads tool calls back out of a model's text.

STANDARD LIBRARY ONLY: the tiny LLM server imports this module with the python of its own
venv, which has neither attrs nor httpx nor ``orchard_env_client``.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "ROLES",
    "BadRequest",
    "JSONObj",
    "TemplateCaps",
    "content_text",
    "error_body",
    "normalize_tools",
    "parse_tool_calls",
    "prepare_messages",
    "render_chatml",
    "tools_system_prompt",
]

ROLES = {"system", "developer", "user", "assistant", "tool", "function"}

JSONObj = dict[str, Any]


class BadRequest(Exception):
    """A client error, answered as `{"error": {...}}` with the given HTTP status."""

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status

    def body(self) -> JSONObj:
        """The OpenAI error object of this error."""
        return error_body(self.message, param=self.param, code=self.code)


def error_body(
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> JSONObj:
    """An OpenAI-style error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# --------------------------------------------------------------------------------------
# Requests -> prompt messages
# --------------------------------------------------------------------------------------


class TemplateCaps:
    """What the tokenizer's chat template can render itself (guessed from its source)."""

    def __init__(self, template: str) -> None:
        self.tools = "tools" in template
        self.tool_calls = "tool_calls" in template
        self.tool_role = "'tool'" in template or '"tool"' in template


def content_text(content: Any, where: str) -> str:
    """OpenAI message content (a string, null, or a list of parts) as plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    pieces.append(part["text"])
                elif isinstance(part.get("content"), str):
                    pieces.append(part["content"])
                else:
                    pieces.append(f"[{part.get('type', 'non-text')} part omitted]")
            else:
                raise BadRequest(f"{where}: content parts must be objects", param=where)
        return "\n".join(pieces)
    raise BadRequest(f"{where}: content must be a string, a list of parts or null", param=where)


def normalize_tools(raw: Any) -> list[JSONObj]:
    """Validate `tools` (OpenAI function tools); returns them as given (maybe empty)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRequest("tools must be a list", param="tools")
    tools = []
    for i, tool in enumerate(raw):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                param=f"tools[{i}]",
            )
        if tool.get("type", "function") != "function":
            raise BadRequest(f"tools[{i}].type must be 'function'", param=f"tools[{i}].type")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise BadRequest(
                f"tools[{i}].function.parameters must be an object", param=f"tools[{i}]"
            )
        tools.append(tool)
    return tools


def tools_system_prompt(tools: list[JSONObj]) -> str:
    """Hermes/Qwen-style tool instructions, for templates that cannot render `tools`."""
    sigs = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    return (
        "You may call one or more functions to assist with the user query.\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{sigs}\n</tools>\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def _arguments_object(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return {} if raw is None else raw


def prepare_messages(raw: Any, tools: list[JSONObj], caps: TemplateCaps) -> list[JSONObj]:
    """Validate OpenAI messages and flatten what the chat template cannot render."""
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages must be a non-empty list", param="messages")
    out: list[JSONObj] = []
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise BadRequest(f"{where} must be an object", param=where)
        role = msg.get("role")
        if role not in ROLES:
            raise BadRequest(
                f"{where}.role must be one of {sorted(ROLES)}, got {role!r}", param=f"{where}.role"
            )
        text = content_text(msg.get("content"), f"{where}.content")
        if role == "developer":
            role = "system"
        if role in ("tool", "function"):
            if caps.tool_role:
                out.append(
                    {"role": "tool", "content": text, "tool_call_id": msg.get("tool_call_id") or ""}
                )
            else:
                out.append(
                    {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}
                )
            continue
        calls = msg.get("tool_calls") if role == "assistant" else None
        if calls:
            if not isinstance(calls, list):
                raise BadRequest(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
            rendered = []
            for j, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise BadRequest(
                        f"{where}.tool_calls[{j}] must have function.name",
                        param=f"{where}.tool_calls[{j}]",
                    )
                rendered.append(
                    {"name": fn["name"], "arguments": _arguments_object(fn.get("arguments"))}
                )
            if caps.tool_calls:
                out.append(
                    {
                        "role": "assistant",
                        "content": text,
                        "tool_calls": [
                            {"type": "function", "id": c.get("id", ""), "function": r}
                            for c, r in zip(calls, rendered, strict=True)
                        ],
                    }
                )
            else:
                blocks = [
                    f"<tool_call>\n{json.dumps(r, ensure_ascii=False)}\n</tool_call>"
                    for r in rendered
                ]
                out.append({"role": "assistant", "content": "\n".join([text, *blocks]).strip()})
            continue
        out.append({"role": role, "content": text})
    if tools and not caps.tools:
        prompt = tools_system_prompt(tools)
        if out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}".strip()}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def render_chatml(messages: list[JSONObj]) -> str:
    """Fallback prompt (SmolLM2's ChatML) for when the tokenizer's template fails."""
    parts = [f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in messages]
    return "".join(parts) + "<|im_start|>assistant\n"


# --------------------------------------------------------------------------------------
# Model text -> OpenAI tool calls
# --------------------------------------------------------------------------------------

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_FENCE_RE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def _as_calls(value: Any, names: set[str]) -> list[JSONObj] | None:
    """`value` as a list of {"name", "arguments": JSON string}, or None if it is not one."""
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict):
            return None
        if isinstance(item.get("function"), dict):  # {"type": "function", "function": {...}}
            item = item["function"]
        name = item.get("name")
        if not isinstance(name, str) or name not in names:
            return None
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            try:
                json.loads(args)
            except ValueError:
                return None
            args_text = args
        elif isinstance(args, dict):
            args_text = json.dumps(args, ensure_ascii=False)
        else:
            return None
        calls.append({"name": name, "arguments": args_text})
    return calls or None


def _loads_loose(text: str) -> Any:
    text = text.strip()
    fenced = _FENCE_RE.match(text)
    if fenced:
        text = fenced.group(1)
    return json.loads(text)


def parse_tool_calls(text: str, names: set[str]) -> tuple[str, list[JSONObj]]:
    """Split model text into (remaining content, tool calls) for the offered tool `names`.

    Recognises `<tool_call>{...}</tool_call>` blocks (Hermes/Qwen/SmolLM style; an
    unclosed last block too), else a JSON object or list of objects with
    name/arguments, bare or in a ```json fence, anywhere in the text.
    """
    if not names:
        return text, []
    calls: list[JSONObj] = []
    if "<tool_call>" in text:
        kept = []
        pos = 0
        for match in _TOOL_CALL_RE.finditer(text):
            try:
                found = _as_calls(_loads_loose(match.group(1)), names)
            except ValueError:
                found = None
            if found is None:
                continue
            calls.extend(found)
            kept.append(text[pos : match.start()])
            pos = match.end()
        if calls:
            kept.append(text[pos:])
            return "".join(kept).strip(), calls
    try:
        found = _as_calls(_loads_loose(text), names)
        if found:
            return "", found
    except ValueError:
        pass
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[\[{]", text):
        try:
            value, end = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        found = _as_calls(value, names)
        if found:
            rest = (text[: match.start()] + text[end:]).strip()
            rest = re.sub(r"```(?:json)?\s*```", "", rest).strip()
            return rest, found
    return text, []

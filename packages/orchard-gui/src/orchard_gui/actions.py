"""Browser actions: the one model of what an agent may do, and its OpenAI tool specs.

The wire form is a JSON object ``{"action": KIND, ...arguments}`` (see ``ACTION_KINDS``);
coordinates are CSS pixels of the viewport, the same pixels as the screenshot. ``Action``
validates that form (``Action.from_dict``) with errors a model can act on, and writes it back
(``to_dict``). ``action_tools()`` offers the same actions as function tools, one per kind,
with the same argument names, so a tool call maps to an action by ``action_from_tool_call``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = [
    "ACTION_KINDS",
    "MAX_COORD",
    "MAX_WAIT_SECONDS",
    "Action",
    "ActionError",
    "action_from_tool_call",
    "action_tools",
]

ACTION_KINDS: tuple[str, ...] = (
    "click",
    "type",
    "press_keys",
    "scroll",
    "wait",
    "goto_url",
    "go_back",
    "drag",
    "hover",
    "new_tab",
    "switch_tab",
    "close_tab",
    "done",
)
"""Every action kind, in the order the tools are offered."""

MAX_COORD = 10_000.0
"""Largest coordinate accepted (CSS px); anything beyond is surely a mistake."""
MAX_WAIT_SECONDS = 30.0
"""Longest single ``wait``."""
MAX_SCROLL = 20_000.0
"""Largest scroll amount (px) in one action."""
MAX_TEXT = 10_000
"""Longest text typed (or answer given) in one action."""
MAX_KEYS = 8
"""Most keys in one chord."""

_BUTTONS = ("left", "right", "middle")
_DIRECTIONS = ("up", "down", "left", "right")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_FORBIDDEN_SCHEMES = ("javascript",)

# Per kind: (required arguments, optional arguments).
_ARGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "click": (("x", "y"), ("button", "double")),
    "type": (("text",), ("submit",)),
    "press_keys": (("keys",), ()),
    "scroll": (("direction",), ("amount", "x", "y")),
    "wait": ((), ("seconds",)),
    "goto_url": (("url",), ()),
    "go_back": ((), ()),
    "drag": (("x", "y", "x2", "y2"), ()),
    "hover": (("x", "y"), ()),
    "new_tab": ((), ("url",)),
    "switch_tab": (("index",), ()),
    "close_tab": ((), ("index",)),
    "done": ((), ("answer",)),
}

# The order of attributes on Action, which is also the order of keys in to_dict().
_FIELDS = (
    "x",
    "y",
    "x2",
    "y2",
    "button",
    "double",
    "text",
    "submit",
    "keys",
    "direction",
    "amount",
    "seconds",
    "url",
    "index",
    "answer",
)


class ActionError(ValueError):
    """A malformed action; the message says what is wrong and what is expected."""


def _coord(kind: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ActionError(f"{kind}: {name!r} must be a number (CSS pixels), got {value!r}")
    if not math.isfinite(value) or not 0 <= value <= MAX_COORD:
        raise ActionError(
            f"{kind}: {name!r} must be a finite number in 0..{MAX_COORD:g} "
            f"(CSS pixels of the viewport), got {value!r}"
        )
    return value


def _number(kind: str, name: str, value: Any, low: float, high: float, *, open_low: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ActionError(f"{kind}: {name!r} must be a finite number, got {value!r}")
    if (value <= low if open_low else value < low) or value > high:
        bound = f"more than {low:g}" if open_low else f"at least {low:g}"
        raise ActionError(f"{kind}: {name!r} must be {bound} and at most {high:g}, got {value!r}")
    return value


def _bool(kind: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ActionError(f"{kind}: {name!r} must be true or false, got {value!r}")
    return value


def _index(kind: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1000:
        raise ActionError(f"{kind}: 'index' must be a tab index (an integer from 0), got {value!r}")
    return value


def _text(kind: str, name: str, value: Any, *, allow_empty: bool) -> str:
    if not isinstance(value, str):
        raise ActionError(f"{kind}: {name!r} must be a string, got {value!r}")
    if not allow_empty and not value:
        raise ActionError(f"{kind}: {name!r} must not be empty")
    if len(value) > MAX_TEXT:
        raise ActionError(f"{kind}: {name!r} is too long ({len(value)} > {MAX_TEXT} characters)")
    return value


def _url(kind: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ActionError(f"{kind}: 'url' must be a non-empty string, got {value!r}")
    value = value.strip()
    match = _SCHEME.match(value)
    if match is None:
        raise ActionError(
            f"{kind}: 'url' must be a full URL with a scheme (e.g. 'http://127.0.0.1:8000/'), "
            f"got {value!r}"
        )
    if match.group(0)[:-1].lower() in _FORBIDDEN_SCHEMES:
        raise ActionError(f"{kind}: javascript: URLs are not allowed")
    if len(value) > MAX_TEXT:
        raise ActionError(f"{kind}: 'url' is too long ({len(value)} characters)")
    return value


def _keys(kind: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not value:
        raise ActionError(
            f"{kind}: 'keys' must be a non-empty list of key names, e.g. ['Control', 'a'], "
            f"got {value!r}"
        )
    if len(value) > MAX_KEYS:
        raise ActionError(f"{kind}: at most {MAX_KEYS} keys in one chord, got {len(value)}")
    for key in value:
        if not isinstance(key, str) or not key or len(key) > 40:
            raise ActionError(
                f"{kind}: every key must be a key name such as 'Enter', 'Control', 'a', got {key!r}"
            )
    return tuple(value)


def _choice(kind: str, name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ActionError(f"{kind}: {name!r} must be one of {list(choices)}, got {value!r}")
    return str(value)


def _check(kind: str, name: str, value: Any) -> Any:
    """The validated value of argument ``name`` of an action of ``kind``."""
    if name in ("x", "y", "x2", "y2"):
        return _coord(kind, name, value)
    if name == "button":
        return _choice(kind, name, value, _BUTTONS)
    if name in ("double", "submit"):
        return _bool(kind, name, value)
    if name == "text":
        return _text(kind, name, value, allow_empty=True)
    if name == "answer":
        return _text(kind, name, value, allow_empty=True)
    if name == "keys":
        return _keys(kind, value)
    if name == "direction":
        return _choice(kind, name, value, _DIRECTIONS)
    if name == "amount":
        return _number(kind, name, value, 0, MAX_SCROLL, open_low=True)
    if name == "seconds":
        return _number(kind, name, value, 0, MAX_WAIT_SECONDS, open_low=False)
    if name == "url":
        return _url(kind, value)
    if name == "index":
        return _index(kind, value)
    raise AssertionError(name)  # pragma: no cover - _ARGS and _FIELDS agree


@attrs.frozen(kw_only=True)
class Action:
    """One validated browser action. Build it with ``Action.from_dict`` (or ``Action.make``).

    ``kind`` is one of ``ACTION_KINDS``; the other attributes are the action's arguments,
    ``None`` when not given (the in-sandbox server applies the documented defaults).
    """

    kind: str
    x: float | None = None
    y: float | None = None
    x2: float | None = None
    y2: float | None = None
    button: str | None = None
    double: bool | None = None
    text: str | None = None
    submit: bool | None = None
    keys: tuple[str, ...] | None = None
    direction: str | None = None
    amount: float | None = None
    seconds: float | None = None
    url: str | None = None
    index: int | None = None
    answer: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Action:
        """Validate the wire form ``{"action": KIND, ...}``; ``ActionError`` says what is wrong."""
        if not isinstance(data, Mapping):
            raise ActionError(f"an action must be a JSON object, got {type(data).__name__}")
        kind = data.get("action")
        if kind not in _ARGS:
            raise ActionError(
                f"unknown action {kind!r}: 'action' must be one of {list(ACTION_KINDS)}"
            )
        required, optional = _ARGS[kind]
        allowed = {"action", *required, *optional}
        extra = sorted(str(k) for k in data if k not in allowed)
        if extra:
            expected = ", ".join([*required, *(f"{o}?" for o in optional)]) or "no arguments"
            raise ActionError(f"{kind}: unexpected argument(s) {extra}; it takes {expected}")
        missing = [name for name in required if data.get(name) is None]
        if missing:
            raise ActionError(f"{kind}: missing required argument(s) {missing}")
        if kind == "scroll" and (data.get("x") is None) != (data.get("y") is None):
            raise ActionError("scroll: give both 'x' and 'y' (where to scroll) or neither")
        if kind == "type" and data.get("text") == "" and not data.get("submit"):
            raise ActionError("type: 'text' must not be empty (or set 'submit': true)")
        values = {
            name: _check(kind, name, data[name])
            for name in (*required, *optional)
            if data.get(name) is not None
        }
        return cls(kind=kind, **values)

    @classmethod
    def make(cls, kind: str, **arguments: Any) -> Action:
        """``Action.make("click", x=10, y=20)``: ``from_dict`` with keyword arguments."""
        return cls.from_dict({"action": kind, **arguments})

    def to_dict(self) -> dict[str, Any]:
        """The wire form: ``{"action": kind}`` plus the arguments that are set."""
        out: dict[str, Any] = {"action": self.kind}
        for name in _FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if name == "keys" else value
        return out

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != "action")
        return f"{self.kind}({args})"


def action_from_tool_call(name: str, arguments: str | Mapping[str, Any] | None) -> Action:
    """The action of a function-tool call (tool name = action kind; arguments as JSON text
    or an already decoded object)."""
    if isinstance(arguments, str):
        text = arguments.strip()
        try:
            decoded = json.loads(text) if text else {}
        except json.JSONDecodeError as exc:
            raise ActionError(f"{name}: the arguments are not valid JSON ({exc})") from None
    else:
        decoded = dict(arguments or {})
    if not isinstance(decoded, dict):
        raise ActionError(f"{name}: the arguments must be a JSON object, got {decoded!r}")
    if "action" in decoded and decoded["action"] != name:
        raise ActionError(f"{name}: the arguments name another action {decoded['action']!r}")
    return Action.from_dict({**decoded, "action": name})


_X = {"type": "number", "description": "x in CSS pixels of the screenshot (0 = left edge)"}
_Y = {"type": "number", "description": "y in CSS pixels of the screenshot (0 = top edge)"}

_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "click": (
        "Click at a point of the page (pixels of the screenshot).",
        {
            "x": _X,
            "y": _Y,
            "button": {"type": "string", "enum": list(_BUTTONS), "description": "default left"},
            "double": {"type": "boolean", "description": "double-click; default false"},
        },
    ),
    "type": (
        "Type text into the focused element (click the field first).",
        {
            "text": {"type": "string", "description": "the text to type"},
            "submit": {"type": "boolean", "description": "press Enter afterwards; default false"},
        },
    ),
    "press_keys": (
        "Press a key or a key chord, e.g. ['Enter'] or ['Control', 'a'].",
        {
            "keys": {
                "type": "array",
                "items": {"type": "string"},
                "description": "key names held together (Playwright names: Enter, Tab, "
                "Backspace, ArrowDown, Control, Shift, a, ...)",
            }
        },
    ),
    "scroll": (
        "Scroll the page (or the element under x, y).",
        {
            "direction": {"type": "string", "enum": list(_DIRECTIONS)},
            "amount": {"type": "number", "description": "pixels; default 400"},
            "x": {"type": "number", "description": "optional point to scroll at"},
            "y": {"type": "number", "description": "optional point to scroll at"},
        },
    ),
    "wait": (
        "Wait for the page to change.",
        {"seconds": {"type": "number", "description": f"default 1, max {MAX_WAIT_SECONDS:g}"}},
    ),
    "goto_url": (
        "Open a URL in the current tab.",
        {"url": {"type": "string", "description": "a full URL with its scheme"}},
    ),
    "go_back": ("Go back to the previous page of the current tab.", {}),
    "drag": (
        "Drag with the mouse from (x, y) to (x2, y2).",
        {
            "x": _X,
            "y": _Y,
            "x2": {"type": "number", "description": "end x"},
            "y2": {"type": "number", "description": "end y"},
        },
    ),
    "hover": ("Move the mouse over a point.", {"x": _X, "y": _Y}),
    "new_tab": (
        "Open a new tab (optionally at a URL) and switch to it.",
        {"url": {"type": "string", "description": "optional URL to open"}},
    ),
    "switch_tab": (
        "Switch to the tab with this index.",
        {"index": {"type": "integer", "description": "tab index, from 0"}},
    ),
    "close_tab": (
        "Close a tab (default: the current one).",
        {"index": {"type": "integer", "description": "tab index; default the current tab"}},
    ),
    "done": (
        "Finish the task; give the answer if the task asks for one.",
        {"answer": {"type": "string", "description": "the final answer, if any"}},
    ),
}


def action_tools(kinds: tuple[str, ...] | list[str] | None = None) -> list[dict[str, Any]]:
    """OpenAI function-tool specs, one per action kind (all of ``ACTION_KINDS`` by default),
    with the same argument names as the action JSON."""
    chosen = ACTION_KINDS if kinds is None else tuple(kinds)
    unknown = [k for k in chosen if k not in _TOOLS]
    if unknown:
        raise ValueError(f"unknown action kinds {unknown}; known: {list(ACTION_KINDS)}")
    tools = []
    for kind in chosen:
        description, properties = _TOOLS[kind]
        required, _ = _ARGS[kind]
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": kind,
                    "description": description,
                    "parameters": {
                        "type": "object",
                        "properties": {k: dict(v) for k, v in properties.items()},
                        "required": list(required),
                        "additionalProperties": False,
                    },
                },
            }
        )
    return tools

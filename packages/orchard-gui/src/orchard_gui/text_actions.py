"""Actions written as text, for models used without function tools.

A reply holds one action as a call on the last line that starts with ``Action:`` (or, if
there is none, the last call-shaped line, or a fenced JSON object in the wire form)::

    Thought: the search box is mark 3 at (412, 88).
    Action: click(412, 88)

Arguments are Python/JSON literals, positional in the order of :data:`POSITIONAL` or by
keyword: ``type("blue shoes", submit=true)``, ``press_keys("Control", "a")``,
``scroll("down", 600)``, ``goto_url("http://127.0.0.1:8000/")``, ``done("42 km")``.
Parsing uses :mod:`ast` (literals only: nothing is evaluated). Errors are
:class:`~orchard_gui.actions.ActionError` with a message a model can act on.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Final

from .actions import ACTION_KINDS, Action, ActionError

__all__ = ["POSITIONAL", "format_action", "parse_text_action"]

POSITIONAL: Final[dict[str, tuple[str, ...]]] = {
    "click": ("x", "y"),
    "type": ("text",),
    "press_keys": (),  # every positional argument is a key
    "scroll": ("direction", "amount"),
    "wait": ("seconds",),
    "goto_url": ("url",),
    "go_back": (),
    "drag": ("x", "y", "x2", "y2"),
    "hover": ("x", "y"),
    "new_tab": ("url",),
    "switch_tab": ("index",),
    "close_tab": ("index",),
    "done": ("answer",),
}
"""The positional argument names of each action kind in text form."""

_FENCED_JSON = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)
_CALL_LINE = re.compile(r"^\s*(?:[Aa]ction\s*:\s*)?`?(" + "|".join(ACTION_KINDS) + r")\s*\(")
_LITERALS = {"true": True, "false": False, "null": None}
_MAX_CALL = 20_000
_ACTION_PREFIX = re.compile(r"^[\s*_>]*[Aa]ction[*_]*\s*:[*_]*\s*`?")
"""``Action:``, also in markdown emphasis (``**Action:**``) or a quote."""


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _LITERALS:
        return _LITERALS[node.id]
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        raise ActionError(
            f"argument {ast.unparse(node)!r} is not a literal (use numbers and quoted strings)"
        ) from None


def _from_call(source: str) -> Action:
    source = source.strip().strip("`*_ ").rstrip(".").strip("`*_ ")
    if len(source) > _MAX_CALL:
        raise ActionError(f"the action is {len(source)} characters long (at most {_MAX_CALL})")
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        raise ActionError(
            f"could not read {source.strip()!r} as a call like click(120, 340)"
        ) from None
    call = tree.body
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise ActionError(f"{source.strip()!r} is not a call like click(120, 340)")
    kind = call.func.id
    if kind not in POSITIONAL:
        raise ActionError(f"unknown action {kind!r}; use one of {list(ACTION_KINDS)}")
    positional = [_literal(arg) for arg in call.args]
    arguments: dict[str, Any] = {"action": kind}
    if kind == "press_keys":
        keys = (
            positional[0]
            if len(positional) == 1 and isinstance(positional[0], list)
            else positional
        )
        if keys:
            arguments["keys"] = keys
    else:
        names = POSITIONAL[kind]
        if len(positional) > len(names):
            raise ActionError(
                f"{kind} takes at most {len(names)} positional argument(s) ({', '.join(names)})"
            )
        arguments.update(zip(names, positional, strict=False))
    for keyword in call.keywords:
        if keyword.arg is None:
            raise ActionError(f"{kind}: **arguments are not allowed")
        if keyword.arg in arguments:
            raise ActionError(f"{kind}: {keyword.arg!r} is given twice")
        arguments[keyword.arg] = _literal(keyword.value)
    return Action.from_dict(arguments)


def parse_text_action(text: str) -> Action:
    """The action in a model's text reply (see the module doc); ``ActionError`` if none."""
    lines = text.splitlines()
    marked = [line for line in lines if _ACTION_PREFIX.match(line)]
    if marked:
        return _from_call(_ACTION_PREFIX.sub("", marked[-1], count=1))
    calls = [line for line in lines if _CALL_LINE.match(line)]
    if calls:
        return _from_call(re.sub(r"^\s*`?", "", calls[-1], count=1))
    fenced = _FENCED_JSON.findall(text)
    if fenced:
        try:
            data = json.loads(fenced[-1])
        except json.JSONDecodeError as exc:
            raise ActionError(f"the JSON action does not parse: {exc}") from None
        return Action.from_dict(data)
    raise ActionError(
        "no action found: end your reply with one line like `Action: click(120, 340)`"
    )


def format_action(action: Action) -> str:
    """The text form of ``action`` (what :func:`parse_text_action` reads back); values are
    Python literals, with every unprintable character (line breaks included) escaped."""
    data = action.to_dict()
    kind = data.pop("action")
    if kind == "press_keys":
        return f"press_keys({', '.join(repr(k) for k in data['keys'])})"
    parts = []
    for name in POSITIONAL[kind]:
        if name not in data:
            break
        parts.append(repr(data.pop(name)))
    parts += [f"{k}={v!r}" for k, v in data.items()]
    return f"{kind}({', '.join(parts)})"

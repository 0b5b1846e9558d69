"""Scripted policies behind the shared scripted chat endpoint, for the demo and the tests.

A responder (see :class:`orchard_env_client.testing.ScriptedModelServer`) reads what a
model would read in the harness's prompt: the instruction (``Task: ...`` in the first user
message), the latest observation's URL and element lines (``[id] role "name" at (x, y)``)
and its own earlier actions, and answers with a tool call (or a text action). So the
whole pipeline runs for real, the real browser in a real sandbox included; only the model
is scripted.

- :func:`oracle_responder`: the offline tasks' scripted solutions
  (:func:`orchard_gui.tasks.oracle_action`).
- :func:`random_responder`: random clicks, typing and scrolling, then ``done``.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from orchard_env_client.testing import ChatRequest, Responder, Step, ToolCall, message_text

from .actions import Action
from .browser import Mark
from .tasks import OracleError, WebTask, oracle_action
from .text_actions import format_action, parse_text_action

__all__ = [
    "PromptView",
    "oracle_responder",
    "random_responder",
    "read_prompt",
]

_MARK_LINE: Final = re.compile(r'^\[(\d+)\] (\S+) "(.*)" at \((-?\d+), (-?\d+)\)$')
_URL_LINE: Final = re.compile(r"^URL: (.*)$", re.MULTILINE)


class PromptView:
    """What a scripted policy reads from a harness request."""

    def __init__(self, request: ChatRequest) -> None:
        messages = request.messages
        users = [m for m in messages if m.get("role") == "user"]
        first = message_text(users[0]) if users else ""
        self.instruction = first.split("\n\n", 1)[0].removeprefix("Task: ").strip()
        observed = [message_text(m) for m in users if _URL_LINE.search(message_text(m))]
        latest = observed[-1] if observed else ""
        url = _URL_LINE.search(latest)
        self.url = url.group(1).strip() if url else ""
        self.marks = [
            Mark(
                id=int(m[1]),
                tag=m[2],
                role=m[2],
                name=m[3],
                x=float(m[4]),
                y=float(m[5]),
                width=0.0,
                height=0.0,
            )
            for line in latest.splitlines()
            if (m := _MARK_LINE.match(line.strip()))
        ]
        self.history = _actions_taken(messages)
        self.tools = bool(request.tool_names)


def read_prompt(request: ChatRequest) -> PromptView:
    """The instruction, URL, marks and earlier actions of a harness request."""
    return PromptView(request)


def _actions_taken(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    taken: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls") or []
        if calls:
            function = calls[0].get("function") or {}
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except json.JSONDecodeError:
                continue
            taken.append({"action": function.get("name"), **arguments})
            continue
        try:
            taken.append(parse_text_action(str(message.get("content") or "")).to_dict())
        except ValueError:
            continue
    return taken


def _reply(action: Mapping[str, Any], tools: bool, thought: str) -> Step:
    data = dict(action)
    kind = str(data.pop("action"))
    if tools:
        return Step(content=thought, tool_calls=(ToolCall(kind, data),))
    text_form = format_action(Action.from_dict(action))
    return Step(content=f"Thought: {thought}\nAction: {text_form}")


def oracle_responder(tasks: Sequence[WebTask]) -> Responder:
    """A responder that solves the given offline tasks (matched by the instance-id key)."""
    by_id = {t.task_id: t for t in tasks}

    def respond(request: ChatRequest) -> Step:
        task = by_id.get(request.key or "")
        if task is None:
            raise OracleError(f"the oracle has no task {request.key!r}")
        view = read_prompt(request)
        action = oracle_action(task, view.instruction, view.url, view.marks, view.history)
        return _reply(action, view.tools, "Following the known solution.")

    return respond


def random_responder(
    seed: int = 0, *, steps: int = 4, viewport: tuple[int, int] = (1280, 720)
) -> Responder:
    """A responder acting at random for ``steps`` actions, then ``done`` (a baseline)."""

    def respond(request: ChatRequest) -> Step:
        view = read_prompt(request)
        rng = random.Random(f"{seed}:{request.key}:{len(view.history)}")
        if len(view.history) >= steps:
            return _reply({"action": "done", "answer": "I am not sure."}, view.tools, "Giving up.")
        roll = rng.random()
        action: dict[str, Any]
        if roll < 0.6:
            action = {
                "action": "click",
                "x": rng.randrange(viewport[0]),
                "y": rng.randrange(viewport[1]),
            }
        elif roll < 0.8:
            action = {"action": "type", "text": rng.choice(["hello", "42", "blue", "x"])}
        else:
            action = {"action": "scroll", "direction": rng.choice(["up", "down"])}
        return _reply(action, view.tools, "Trying something.")

    return respond

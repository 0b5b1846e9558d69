"""OpenHands conversation events → an Orchard :class:`~orchard_swe.trajectory.Trajectory`.

The messages are what the model was sent, rebuilt the way the SDK builds its requests:
the LLM-convertible events (system prompt, user and agent messages, actions, observations,
agent errors) through ``LLMConvertibleEvent.events_to_messages`` (parallel tool calls of
one response become one assistant message), then each message serialised for chat
completions with string content. The tools are the system prompt event's tool
definitions as OpenAI function specs.

Exit status (:func:`exit_status_of`): the agent called ``finish`` → ``submitted``; the
step cap → ``step_limit``; the budget → ``cost_limit``; the time limit → ``time_limit``;
OpenHands' stuck detector → ``stuck``; any other conversation error → ``error: ...``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from openhands.sdk.event import ActionEvent, Event, LLMConvertibleEvent, SystemPromptEvent
from openhands.sdk.event.conversation_error import ConversationErrorEvent
from openhands.sdk.llm import Message
from openhands.sdk.tool.builtins import FinishTool

from orchard_swe.trajectory import (
    COST_LIMIT,
    MESSAGE_KEYS,
    STEP_LIMIT,
    SUBMITTED,
    TIME_LIMIT,
    Trajectory,
    TrajectoryMetadata,
    error_status,
)

__all__ = [
    "STUCK",
    "chat_message",
    "conversation_errors",
    "events_to_messages",
    "exit_status_of",
    "finished",
    "tool_specs_of",
    "trajectory_from_events",
]

STUCK: Final = "stuck"
"""This harness's own exit status: OpenHands' stuck detector stopped a looping agent."""

_MAX_ITERATIONS: Final = "MaxIterationsReached"
_MAX_BUDGET: Final = "MaxBudgetReached"


def chat_message(message: Message) -> dict[str, Any]:
    """One SDK message as an OpenAI chat message (string content; tool call arguments as
    JSON strings)."""
    raw = message.to_chat_dict(
        cache_enabled=False,
        vision_enabled=False,
        function_calling_enabled=True,
        force_string_serializer=True,
        send_reasoning_content=True,
    )
    out: dict[str, Any] = {"role": raw.get("role"), "content": raw.get("content")}
    for key in MESSAGE_KEYS[2:]:
        if raw.get(key) is not None:
            out[key] = raw[key]
    calls = []
    for call in out.get("tool_calls") or []:
        fn: Mapping[str, Any] = call.get("function") or {}
        arguments = fn.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        calls.append(
            {
                "id": str(call.get("id") or ""),
                "type": "function",
                "function": {"name": str(fn.get("name") or ""), "arguments": arguments},
            }
        )
    if calls:
        out["tool_calls"] = calls
    if out["role"] == "assistant" and out["content"] == "" and calls:
        out["content"] = None
    return out


def events_to_messages(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The conversation as OpenAI chat messages (see the module doc)."""
    convertible = [e for e in events if isinstance(e, LLMConvertibleEvent)]
    return [chat_message(m) for m in LLMConvertibleEvent.events_to_messages(convertible)]


def tool_specs_of(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The OpenAI function specs of the tools offered (from the system prompt event), as
    the agent sends them (with its optional ``security_risk`` and ``summary`` fields)."""
    for event in events:
        if isinstance(event, SystemPromptEvent):
            specs = [t.to_openai_tool(add_security_risk_prediction=True) for t in event.tools]
            return json.loads(json.dumps(specs))
    return []


def finished(events: Sequence[Event]) -> bool:
    """Whether the agent called the ``finish`` tool."""
    return any(isinstance(e, ActionEvent) and e.tool_name == FinishTool.name for e in events)


def conversation_errors(events: Sequence[Event]) -> list[ConversationErrorEvent]:
    """The conversation-level errors (limits reached, failures), in order."""
    return [e for e in events if isinstance(e, ConversationErrorEvent)]


def exit_status_of(
    events: Sequence[Event],
    execution_status: str,
    *,
    steps: int,
    max_steps: int,
    timed_out: bool = False,
) -> tuple[str, str | None]:
    """``(exit_status, error)`` of a finished run (see the module doc)."""
    if finished(events):
        return SUBMITTED, None
    errors = conversation_errors(events)
    codes = {e.code for e in errors}
    if timed_out:
        return TIME_LIMIT, None
    if _MAX_BUDGET in codes:
        return COST_LIMIT, None
    if _MAX_ITERATIONS in codes or (max_steps > 0 and steps >= max_steps):
        return STEP_LIMIT, None
    if execution_status == "stuck":
        return STUCK, None
    if errors:
        last = errors[-1]
        return error_status(f"{last.code}: {last.detail}"), f"{last.code}: {last.detail}"
    detail = f"the agent stopped without finishing (status {execution_status})"
    return error_status(detail), detail


def trajectory_from_events(
    events: Sequence[Event],
    metadata: TrajectoryMetadata,
) -> Trajectory:
    """A trajectory with the events' messages and tools and the given metadata; its
    ``steps`` field is set to the number of model replies (assistant messages)."""
    messages = events_to_messages(events)
    metadata.steps = sum(1 for m in messages if m["role"] == "assistant")
    return Trajectory(metadata=metadata, messages=messages, tools=tool_specs_of(events))

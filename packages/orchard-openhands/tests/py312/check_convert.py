"""Pure-logic checks of the event converter, run with the 3.12 venv's Python.

Not a pytest module (the suite runs on 3.11 and must not import the SDK):
``test_openhands_harness.py::test_event_converter`` runs its ``check_*`` functions with
``tests/py312_checks.py``.
"""

from __future__ import annotations

import json

from openhands.sdk.event import ActionEvent, MessageEvent, ObservationEvent, SystemPromptEvent
from openhands.sdk.event.conversation_error import ConversationErrorEvent
from openhands.sdk.llm import Message, MessageToolCall, TextContent
from openhands.sdk.tool.builtins import FinishAction, FinishObservation, FinishTool
from openhands.tools.terminal.definition import TerminalAction, TerminalObservation

from orchard_openhands.convert import (
    chat_message,
    events_to_messages,
    exit_status_of,
    tool_specs_of,
    trajectory_from_events,
)
from orchard_swe.trajectory import Trajectory, TrajectoryMetadata


def _call(call_id: str, name: str, arguments: dict[str, object]) -> MessageToolCall:
    return MessageToolCall(
        id=call_id, name=name, arguments=json.dumps(arguments), origin="completion"
    )


def _action(
    call_id: str, response: str, command: str, thought: str = ""
) -> tuple[ActionEvent, ObservationEvent]:
    action = ActionEvent(
        source="agent",
        thought=[TextContent(text=thought)] if thought else [],
        action=TerminalAction(command=command),
        tool_name="terminal",
        tool_call_id=call_id,
        tool_call=_call(call_id, "terminal", {"command": command}),
        llm_response_id=response,
    )
    observation = ObservationEvent(
        source="environment",
        observation=TerminalObservation.from_text(text=f"ran {command}", command=command),
        action_id=action.id,
        tool_name="terminal",
        tool_call_id=call_id,
    )
    return action, observation


def _finish(call_id: str = "c9") -> list[object]:
    action = ActionEvent(
        source="agent",
        thought=[TextContent(text="Done.")],
        action=FinishAction(message="fixed"),
        tool_name=FinishTool.name,
        tool_call_id=call_id,
        tool_call=_call(call_id, FinishTool.name, {"message": "fixed"}),
        llm_response_id="r9",
    )
    observation = ObservationEvent(
        source="environment",
        observation=FinishObservation.from_text(text="fixed"),
        action_id=action.id,
        tool_name=FinishTool.name,
        tool_call_id=call_id,
    )
    return [action, observation]


def _events(*, finish: bool) -> list[object]:
    system = SystemPromptEvent(
        source="agent",
        system_prompt=TextContent(text="You are OpenHands."),
        tools=list(FinishTool.create()),
    )
    user = MessageEvent(
        source="user", llm_message=Message(role="user", content=[TextContent(text="Fix it.")])
    )
    a1, o1 = _action("c1", "r1", "ls", thought="Looking.")
    a2, o2 = _action("c2", "r2", "pwd", thought="Two at once.")
    a3, o3 = _action("c3", "r2", "id")  # the same response: one assistant message
    events: list[object] = [system, user, a1, o1, a2, a3, o2, o3]
    return events + (_finish() if finish else [])


def check_messages() -> None:
    messages = events_to_messages(_events(finish=True))  # type: ignore[arg-type]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
    ], [m["role"] for m in messages]
    assert messages[0]["content"] == "You are OpenHands."
    assert messages[1]["content"] == "Fix it."
    first = messages[2]
    assert first["content"] == "Looking."
    assert first["tool_calls"] == [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "terminal", "arguments": json.dumps({"command": "ls"})},
        }
    ]
    assert messages[3]["tool_call_id"] == "c1" and "ran ls" in messages[3]["content"]
    assert messages[3]["name"] == "terminal"
    assert [c["id"] for c in messages[4]["tool_calls"]] == ["c2", "c3"]
    assert all(isinstance(m["content"], str | None) for m in messages)


def check_empty_assistant_content_is_none() -> None:
    message = Message(role="assistant", content=[], tool_calls=[_call("x", "terminal", {})])
    out = chat_message(message)
    assert out["content"] is None and out["tool_calls"][0]["id"] == "x"


def check_tools() -> None:
    specs = tool_specs_of(_events(finish=False))  # type: ignore[arg-type]
    assert [s["function"]["name"] for s in specs] == ["finish"]
    assert specs[0]["type"] == "function" and "parameters" in specs[0]["function"]


def check_exit_status() -> None:
    done = _events(finish=True)
    running = _events(finish=False)

    def error(code: str) -> list[object]:
        return [*running, ConversationErrorEvent(source="environment", code=code, detail="d")]

    def status(events: list[object], execution: str = "finished", **kw: object) -> str:
        return exit_status_of(events, execution, steps=3, max_steps=30, **kw)[0]  # type: ignore[arg-type]

    assert status(done) == "submitted"
    assert status(error("MaxIterationsReached"), "error") == "step_limit"
    assert status(error("MaxBudgetReached"), "error") == "cost_limit"
    assert status(running, "paused", timed_out=True) == "time_limit"
    assert status(running, "stuck") == "stuck"
    assert exit_status_of(running, "finished", steps=30, max_steps=30)[0] == "step_limit"  # type: ignore[arg-type]
    broken, why = exit_status_of(error("APIConnectionError"), "error", steps=1, max_steps=30)  # type: ignore[arg-type]
    assert broken.startswith("error: APIConnectionError") and why == "APIConnectionError: d"


def check_trajectory() -> None:
    meta = TrajectoryMetadata(
        task_id="t", recipe="swe", harness="openhands", exit_status="submitted"
    )
    traj = trajectory_from_events(_events(finish=True), meta)  # type: ignore[arg-type]
    assert traj.metadata.steps == 3
    again = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    assert again.messages == traj.messages and again.tools == traj.tools

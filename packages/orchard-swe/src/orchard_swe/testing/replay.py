"""Scripts for SWE harness tests, replayed by the shared scripted model server.

The server (:class:`ScriptedModelServer`) and its script types live in
:mod:`orchard_env_client.testing` (every recipe's tests use it); they are re-exported here.
A SWE step is a text reply (mini-swe-agent's text-based configs: a fenced
``mswea_bash_command`` block) and/or tool calls (the tools harness, or mini's tool-calling
config).

Script builders: :func:`gold_script` (apply a known patch, then submit), :func:`empty_script`
(submit at once), :func:`junk_script` (never act) and :func:`from_trajectory` (replay a
recorded trajectory's assistant turns).
"""

from __future__ import annotations

import base64
from typing import Final, Literal

from orchard_env_client.testing import (
    RequestRecord,
    Script,
    ScriptedModelServer,
    Step,
    ToolCall,
)

from ..trajectory import Trajectory

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

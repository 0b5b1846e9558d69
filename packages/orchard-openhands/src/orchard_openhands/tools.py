"""OpenHands' stock ``terminal`` and ``file_editor`` tools, bound to an Orchard sandbox.

The OpenHands agent names its tools by registry name (``Tool(name=..., params=...)``) and
builds them per conversation, so the sandbox is handed over through a *session*: a key
registered here (:func:`open_session`) that the tools' ``create`` looks up. The model sees
exactly the stock tools: the same names, descriptions and parameters; only the executors
differ, and the file editor's "current working directory" line names the sandbox's
repository instead of the local scratch directory OpenHands runs in.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar, Final

import attrs
from openhands.sdk.tool import Tool, register_tool
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.terminal import TerminalTool

from .editor import SandboxFileEditorExecutor
from .terminal import SandboxTerminalExecutor

if TYPE_CHECKING:
    from openhands.sdk.conversation.state import ConversationState

__all__ = [
    "FILE_EDITOR_TOOL",
    "TERMINAL_TOOL",
    "OrchardFileEditorTool",
    "OrchardTerminalTool",
    "SandboxSession",
    "open_session",
    "tool_specs",
]

TERMINAL_TOOL: Final = "OrchardTerminalTool"
"""Registry name of the sandbox-bound terminal tool (the model sees ``terminal``)."""
FILE_EDITOR_TOOL: Final = "OrchardFileEditorTool"
"""Registry name of the sandbox-bound file editor (the model sees ``file_editor``)."""


@attrs.define
class SandboxSession:
    """The executors one conversation's tools use, and the sandbox repository."""

    terminal: SandboxTerminalExecutor
    editor: SandboxFileEditorExecutor
    repo_dir: str


_SESSIONS: dict[str, SandboxSession] = {}
_LOCK = threading.Lock()


@contextlib.contextmanager
def open_session(session: SandboxSession) -> Iterator[str]:
    """Register ``session`` for the tools; yields its key (pass it to :func:`tool_specs`)."""
    key = uuid.uuid4().hex
    with _LOCK:
        _SESSIONS[key] = session
    try:
        yield key
    finally:
        with _LOCK:
            _SESSIONS.pop(key, None)


def _session(key: str) -> SandboxSession:
    with _LOCK:
        found = _SESSIONS.get(key)
    if found is None:
        raise KeyError(f"no open Orchard sandbox session {key!r}")
    return found


class OrchardTerminalTool(TerminalTool):
    """OpenHands' ``terminal`` tool with :class:`SandboxTerminalExecutor`."""

    name: ClassVar[str] = TerminalTool.name

    @classmethod
    def create(  # type: ignore[override]
        cls, conv_state: ConversationState, session: str
    ) -> Sequence[TerminalTool]:
        """The stock tool definition with the session's executor."""
        return super().create(conv_state, executor=_session(session).terminal)


class OrchardFileEditorTool(FileEditorTool):
    """OpenHands' ``file_editor`` tool with :class:`SandboxFileEditorExecutor`."""

    name: ClassVar[str] = FileEditorTool.name

    @classmethod
    def create(  # type: ignore[override]
        cls, conv_state: ConversationState, session: str
    ) -> Sequence[FileEditorTool]:
        """The stock tool definition, pointed at the sandbox repository, with our executor."""
        bound = _session(session)
        local_dir = str(conv_state.workspace.working_dir)
        tools = []
        for tool in super().create(conv_state):
            description = tool.description.replace(
                f"Your current working directory is: {local_dir}",
                f"Your current working directory is: {bound.repo_dir}",
            )
            update = {"description": description, "executor": bound.editor}
            tools.append(tool.model_copy(update=update))
        return tools


register_tool(TERMINAL_TOOL, OrchardTerminalTool)
register_tool(FILE_EDITOR_TOOL, OrchardFileEditorTool)


def tool_specs(session_key: str) -> list[Tool]:
    """The agent's tool specs for an open session (the built-in ``finish`` and ``think``
    tools are added by the agent itself)."""
    return [
        Tool(name=TERMINAL_TOOL, params={"session": session_key}),
        Tool(name=FILE_EDITOR_TOOL, params={"session": session_key}),
    ]

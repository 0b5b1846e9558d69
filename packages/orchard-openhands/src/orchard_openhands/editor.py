"""The OpenHands file-editor tool's executor, editing files in an Orchard sandbox.

The edits themselves are Orchard's own sandbox editor
(:class:`orchard_swe.harness.editor.SandboxEditor`: exact byte-level ``view``, ``create``,
``str_replace``, ``insert`` and ``undo_edit`` over the sandbox's exec and file transfer);
this executor turns a ``file_editor`` action into its arguments and its answer (or its
:class:`~orchard_swe.harness.editor.ToolError`) into a ``FileEditorObservation``. As in
OpenHands, ``create`` refuses to overwrite an existing file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from openhands.sdk.tool import ToolExecutor
from openhands.tools.file_editor.definition import FileEditorAction, FileEditorObservation

from orchard_env_client import AsyncSandbox, OrchardError
from orchard_swe.harness.editor import SandboxEditor, ToolError

from .bridge import LoopBridge

if TYPE_CHECKING:
    from openhands.sdk.conversation import LocalConversation

__all__ = ["SandboxFileEditorExecutor"]

_EDITOR_TIMEOUT_S: Final = 300.0
_ACTION_FIELDS: Final = (
    "command",
    "path",
    "file_text",
    "old_str",
    "new_str",
    "insert_line",
    "view_range",
)


def action_arguments(action: FileEditorAction) -> dict[str, Any]:
    """The action's fields as the sandbox editor's arguments (unset ones left out)."""
    values = {name: getattr(action, name) for name in _ACTION_FIELDS}
    return {name: value for name, value in values.items() if value is not None}


class SandboxFileEditorExecutor(ToolExecutor[FileEditorAction, FileEditorObservation]):
    """``file_editor`` actions on files in the sandbox (see the module doc)."""

    def __init__(
        self, sandbox: AsyncSandbox, bridge: LoopBridge, repo_dir: str, *, max_output_chars: int
    ) -> None:
        self.editor = SandboxEditor(sandbox, repo_dir, max_output_chars=max_output_chars)
        self.bridge = bridge

    async def _run(self, args: dict[str, Any]) -> str:
        if args.get("command") == "create":
            path = self.editor.resolve(str(args.get("path", "")))
            job = await self.editor.sandbox.exec(["test", "-e", path], timeout=60)
            if job.exit_code == 0:
                raise ToolError(
                    f"Invalid `path` parameter: {path}. File already exists at: {path}. "
                    "Cannot overwrite files using command `create`."
                )
        return await self.editor(args)

    def __call__(
        self, action: FileEditorAction, conversation: LocalConversation | None = None
    ) -> FileEditorObservation:
        """Execute one ``file_editor`` action."""
        del conversation
        try:
            text = self.bridge.run(self._run(action_arguments(action)), _EDITOR_TIMEOUT_S)
        except ToolError as exc:
            return FileEditorObservation.from_text(
                text=str(exc), command=action.command, path=action.path, is_error=True
            )
        except (OrchardError, TimeoutError) as exc:
            return FileEditorObservation.from_text(
                text=f"The sandbox refused the request: {type(exc).__name__}: {exc}",
                command=action.command,
                path=action.path,
                is_error=True,
            )
        return FileEditorObservation.from_text(text=text, command=action.command, path=action.path)

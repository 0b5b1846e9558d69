"""A file editor tool acting on files in an Orchard sandbox (``str_replace_based_edit_tool``).

Commands: ``view`` (a file with line numbers, optionally a line range, or a directory
listing two levels deep), ``create``, ``str_replace`` (exactly one occurrence of
``old_str`` must exist), ``insert`` (after line N; 0 inserts at the top) and
``undo_edit`` (revert this editor's last write to a file).

Edits are exact and byte-level: the file is read as bytes, ``old_str``/``new_str`` are
UTF-8 encoded and spliced in, and nothing else of the file changes (line endings,
encoding, a missing final newline). Writes go through a temp file in the sandbox and
``cat >`` so the edited file keeps its inode and mode (a script stays executable).
Mistakes by the model raise :class:`ToolError`, whose message is shown to the model.
"""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Mapping
from typing import Any, Final

from orchard_env_client import AsyncSandbox, PathNotFound

from . import truncate_middle

__all__ = ["EDITOR_TOOL", "SandboxEditor", "ToolError"]

EDITOR_TOOL_NAME: Final = "str_replace_based_edit_tool"

EDITOR_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": EDITOR_TOOL_NAME,
        "description": (
            "View, create and edit files.\n"
            "* `view` on a file shows it with line numbers (`view_range` limits the lines); "
            "on a directory it lists files up to 2 levels deep (hidden ones left out).\n"
            "* `create` writes `file_text` to `path` (parent directories are created; an "
            "existing file is overwritten).\n"
            "* `str_replace` replaces `old_str` with `new_str`. `old_str` must match EXACTLY "
            "ONE place in the file, character for character including whitespace and "
            "indentation; include enough surrounding lines to make it unique.\n"
            "* `insert` inserts `new_str` as new lines after line `insert_line` "
            "(0 inserts at the top of the file).\n"
            "* `undo_edit` reverts the last edit this tool made to `path`.\n"
            "Relative paths are taken relative to the repository root."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "enum": ["view", "create", "str_replace", "insert", "undo_edit"],
                    "description": "The operation to perform.",
                },
                "path": {
                    "type": "string",
                    "description": "Path of the file or directory, e.g. /workspace/repo/src/a.py.",
                },
                "file_text": {"type": "string", "description": "For `create`: the content."},
                "old_str": {
                    "type": "string",
                    "description": "For `str_replace`: the exact text to replace.",
                },
                "new_str": {
                    "type": "string",
                    "description": "For `str_replace` (replacement, default empty) and `insert`.",
                },
                "insert_line": {
                    "type": "integer",
                    "description": "For `insert`: the line after which `new_str` goes.",
                },
                "view_range": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "description": "For `view` of a file: [start, end], 1-based; end -1 = EOF.",
                },
            },
            "required": ["command", "path"],
        },
    },
}

SNIPPET_CONTEXT: Final = 4
"""Lines shown before and after an edit in its confirmation."""

_KIND_SCRIPT: Final = (
    'if [ -d "$1" ]; then echo dir; elif [ -f "$1" ]; then echo file; '
    'elif [ -e "$1" ]; then echo other; else echo missing; fi'
)
_WRITE_SCRIPT: Final = (
    'mkdir -p -- "$(dirname -- "$1")" && cat -- "$2" > "$1"; rc=$?; rm -f -- "$2"; exit $rc'
)
_LIST_SCRIPT: Final = (
    "cd -- \"$1\" && find . -mindepth 1 -maxdepth 2 -not -path '*/.*' -printf '%y %P\\n' "
    "2>/dev/null | LC_ALL=C sort -k2"
)


class ToolError(Exception):
    """A tool call the model got wrong; the message is returned to the model."""


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{first + i:6}\t{line}" for i, line in enumerate(lines))


def _text_lines(data: bytes) -> list[str]:
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _as_int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise ToolError(f"Parameter `{name}` must be an integer, got {value!r}.")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise ToolError(f"Parameter `{name}` must be an integer, got {value!r}.")


def _as_str(args: Mapping[str, Any], name: str, *, required: bool) -> str | None:
    value = args.get(name)
    if value is None:
        if required:
            raise ToolError(f"Parameter `{name}` is required for command `{args.get('command')}`.")
        return None
    if not isinstance(value, str):
        raise ToolError(f"Parameter `{name}` must be a string, got {type(value).__name__}.")
    return value


class SandboxEditor:
    """The ``str_replace_based_edit_tool`` over one sandbox; paths resolve from ``repo_dir``."""

    def __init__(
        self,
        sandbox: AsyncSandbox,
        repo_dir: str = "/workspace/repo",
        *,
        max_output_chars: int = 16_000,
        timeout: float = 60,
    ) -> None:
        self.sandbox = sandbox
        self.repo_dir = repo_dir
        self.max_output_chars = max_output_chars
        self.timeout = timeout
        self._history: dict[str, list[bytes | None]] = {}

    # ------------------------------------------------------------ sandbox access

    def resolve(self, path: str) -> str:
        """An absolute, normalised path (relative ones are taken from ``repo_dir``)."""
        if not path.strip():
            raise ToolError("Parameter `path` must not be empty.")
        joined = path if path.startswith("/") else posixpath.join(self.repo_dir, path)
        return posixpath.normpath(joined)

    async def _kind(self, path: str) -> str:
        job = await self.sandbox.exec(["bash", "-c", _KIND_SCRIPT, "_", path], timeout=self.timeout)
        if job.exit_code != 0:
            raise ToolError(f"Could not inspect {path}: {job.error or job.stderr.strip()}")
        return job.stdout.strip()

    async def _read(self, path: str) -> bytes:
        try:
            return await self.sandbox.download_content(path)
        except PathNotFound as exc:
            raise ToolError(f"The path {path} does not exist.") from exc

    async def _write(self, path: str, data: bytes) -> None:
        tmp = f"/tmp/.orchard-edit-{uuid.uuid4().hex}"
        await self.sandbox.upload_content(tmp, data)
        job = await self.sandbox.exec(
            ["bash", "-c", _WRITE_SCRIPT, "_", path, tmp], timeout=self.timeout
        )
        if job.exit_code != 0:
            detail = (job.stderr or job.stdout or job.error or "").strip()
            raise ToolError(f"Could not write {path}: {detail}")

    async def _existing_file(self, path: str) -> bytes:
        kind = await self._kind(path)
        if kind == "missing":
            raise ToolError(f"The path {path} does not exist.")
        if kind != "file":
            raise ToolError(f"The path {path} is a {kind}, not a regular file.")
        return await self._read(path)

    def _remember(self, path: str, before: bytes | None) -> None:
        self._history.setdefault(path, []).append(before)

    # ------------------------------------------------------------ commands

    async def __call__(self, args: Mapping[str, Any]) -> str:
        """Run one tool call (its decoded arguments); return the text for the model."""
        command = args.get("command")
        path_arg = _as_str(args, "path", required=True)
        assert path_arg is not None
        path = self.resolve(path_arg)
        if command == "view":
            return await self.view(path, args.get("view_range"))
        if command == "create":
            text = _as_str(args, "file_text", required=True)
            assert text is not None
            return await self.create(path, text)
        if command == "str_replace":
            old = _as_str(args, "old_str", required=True)
            new = _as_str(args, "new_str", required=False)
            assert old is not None
            return await self.str_replace(path, old, new or "")
        if command == "insert":
            if args.get("insert_line") is None:
                raise ToolError("Parameter `insert_line` is required for command `insert`.")
            line = _as_int(args.get("insert_line"), "insert_line")
            new = _as_str(args, "new_str", required=True)
            assert new is not None
            return await self.insert(path, line, new)
        if command == "undo_edit":
            return await self.undo_edit(path)
        raise ToolError(
            f"Unknown command {command!r}; use one of view, create, str_replace, insert, undo_edit."
        )

    async def view(self, path: str, view_range: Any = None) -> str:
        """A file with line numbers (``cat -n`` style) or a directory listing, 2 levels."""
        kind = await self._kind(path)
        if kind == "missing":
            raise ToolError(f"The path {path} does not exist.")
        if kind == "dir":
            if view_range is not None:
                raise ToolError("`view_range` is only allowed when viewing a file.")
            job = await self.sandbox.exec(
                ["bash", "-c", _LIST_SCRIPT, "_", path], timeout=self.timeout
            )
            entries = []
            for row in job.stdout.splitlines():
                kind_char, _, entry = row.partition(" ")
                entries.append(posixpath.join(path, entry) + ("/" if kind_char == "d" else ""))
            listing = "\n".join(entries) if entries else "(empty)"
            body = (
                f"Files and directories up to 2 levels deep in {path}, "
                f"excluding hidden items:\n{path}/\n{listing}"
            )
            return truncate_middle(body, self.max_output_chars)
        if kind != "file":
            raise ToolError(f"The path {path} is a {kind}, not a regular file or directory.")
        data = await self._read(path)
        if b"\0" in data[:8192]:
            return f"{path} looks like a binary file ({len(data)} bytes); it is not shown."
        lines = _text_lines(data)
        first = 1
        if view_range is not None:
            if not isinstance(view_range, list | tuple) or len(view_range) != 2:
                raise ToolError("`view_range` must be a list of two integers, [start, end].")
            start = _as_int(view_range[0], "view_range")
            end = _as_int(view_range[1], "view_range")
            n = len(lines)
            if not 1 <= start <= max(n, 1):
                raise ToolError(
                    f"Invalid `view_range` {[start, end]}: start must be within [1, {n}]."
                )
            if end != -1 and not start <= end:
                raise ToolError(f"Invalid `view_range` {[start, end]}: end must be -1 or >= start.")
            end = n if end == -1 else min(end, n)
            lines = lines[start - 1 : end]
            first = start
        if not lines:
            return f"{path} is empty."
        body = f"Here's the result of running `cat -n` on {path}:\n{_numbered(lines, first)}\n"
        if len(body) > self.max_output_chars:
            body = truncate_middle(body, self.max_output_chars)
            body += "\n[The file is long: use `view_range` to see specific lines.]"
        return body

    async def create(self, path: str, file_text: str) -> str:
        """Write ``file_text`` to ``path`` (creating parents; an existing file is replaced)."""
        kind = await self._kind(path)
        if kind not in ("missing", "file"):
            raise ToolError(f"Cannot create {path}: it exists and is a {kind}.")
        before = await self._read(path) if kind == "file" else None
        await self._write(path, file_text.encode("utf-8"))
        self._remember(path, before)
        if before is None:
            return f"File created successfully at: {path}"
        return f"File at {path} overwritten successfully."

    async def str_replace(self, path: str, old_str: str, new_str: str) -> str:
        """Replace the one occurrence of ``old_str`` in the file by ``new_str``."""
        if old_str == "":
            raise ToolError("Parameter `old_str` must not be empty.")
        data = await self._existing_file(path)
        old = old_str.encode("utf-8")
        first = data.find(old)
        if first < 0:
            raise ToolError(
                f"No replacement was performed: old_str `{old_str}` did not appear verbatim "
                f"in {path}."
            )
        occurrences = [first]
        nxt = data.find(old, first + 1)
        while nxt >= 0 and len(occurrences) < 50:
            occurrences.append(nxt)
            nxt = data.find(old, nxt + 1)
        if len(occurrences) > 1:
            lines = sorted({_line_of(data, off) for off in occurrences})
            raise ToolError(
                f"No replacement was performed: old_str `{old_str}` occurs "
                f"{len(occurrences)}{'+' if nxt >= 0 else ''} times in {path}, at lines "
                f"{lines}. Include more context so that it is unique."
            )
        new = new_str.encode("utf-8")
        updated = data[:first] + new + data[first + len(old) :]
        await self._write(path, updated)
        self._remember(path, data)
        start_line = _line_of(updated, first)
        end_line = start_line + new.count(b"\n")
        return (
            f"The file {path} has been edited. "
            f"{self._snippet(updated, start_line, end_line)}"
            "Review the changes and make sure they are as expected. Edit the file again if "
            "necessary."
        )

    async def insert(self, path: str, insert_line: int, new_str: str) -> str:
        """Insert ``new_str`` as lines after line ``insert_line`` (0 = the top)."""
        data = await self._existing_file(path)
        parts = data.split(b"\n")
        n_lines = len(parts) - 1 if parts[-1] == b"" else len(parts)
        if not 0 <= insert_line <= n_lines:
            raise ToolError(
                f"Invalid `insert_line` {insert_line}: it must be within [0, {n_lines}] "
                f"({path} has {n_lines} lines)."
            )
        new_parts = new_str.encode("utf-8").split(b"\n")
        if parts == [b""]:  # an empty file: the inserted text becomes its content
            updated = new_str.encode("utf-8") + (b"" if new_str.endswith("\n") else b"\n")
        else:
            if new_parts[-1] == b"" and len(new_parts) > 1:
                new_parts.pop()  # "a\n" inserts one line, not a line and a blank one
            updated = b"\n".join(parts[:insert_line] + new_parts + parts[insert_line:])
        await self._write(path, updated)
        self._remember(path, data)
        start_line = insert_line + 1
        end_line = insert_line + max(1, len(new_parts))
        return (
            f"The file {path} has been edited. "
            f"{self._snippet(updated, start_line, end_line)}"
            "Review the changes and make sure they are as expected (correct indentation, "
            "no duplicate lines). Edit the file again if necessary."
        )

    async def undo_edit(self, path: str) -> str:
        """Restore the content ``path`` had before this editor's last write to it."""
        history = self._history.get(path)
        if not history:
            raise ToolError(f"No edit of {path} to undo.")
        before = history.pop()
        if before is None:
            job = await self.sandbox.exec(["rm", "-f", "--", path], timeout=self.timeout)
            if job.exit_code != 0:
                raise ToolError(f"Could not remove {path}: {job.stderr.strip()}")
            return f"Undid the creation of {path} (the file was removed)."
        await self._write(path, before)
        lines = _text_lines(before)
        shown = truncate_middle(_numbered(lines, 1), self.max_output_chars)
        return f"Last edit to {path} undone. Its content is now:\n{shown}\n"

    def _snippet(self, data: bytes, start_line: int, end_line: int) -> str:
        lines = _text_lines(data)
        lo = max(1, start_line - SNIPPET_CONTEXT)
        hi = min(len(lines), end_line + SNIPPET_CONTEXT)
        shown = truncate_middle(_numbered(lines[lo - 1 : hi], lo), self.max_output_chars)
        return f"Here's a snippet of the edited file (`cat -n`):\n{shown}\n"

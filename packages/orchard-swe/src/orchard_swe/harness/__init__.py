"""Agent harnesses that solve a SWE task inside an Orchard sandbox.

* :func:`run_tools_agent` (``orchard_swe.harness.tools``): our own OpenAI function-calling
  harness (``bash``, ``str_replace_based_edit_tool``, ``submit``); async.
* :func:`run_mini_agent` (``orchard_swe.harness.mini``): mini-swe-agent's own
  ``DefaultAgent`` with its shipped SWE-bench config, over :class:`OrchardEnvironment`;
  sync (mini is sync), run it in a thread.

Both return a :class:`orchard_swe.trajectory.Trajectory` whose ``final_patch`` is the diff
of the repository in the sandbox against the commit it started from (new files
included). The submodules are imported lazily: importing mini-swe-agent is slow.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .mini import OrchardEnvironment, run_mini_agent
    from .tools import run_tools_agent

__all__ = [
    "OrchardEnvironment",
    "PatchError",
    "base_commit_command",
    "decode_patch",
    "final_patch_command",
    "run_mini_agent",
    "run_tools_agent",
    "truncate_middle",
]

_LAZY = {
    "run_tools_agent": "tools",
    "run_mini_agent": "mini",
    "OrchardEnvironment": "mini",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class PatchError(RuntimeError):
    """The final patch could not be computed in the sandbox."""


def base_commit_command(repo_dir: str) -> str:
    """Shell command printing the repository's HEAD commit (nothing if it has none)."""
    return f"git -C {shlex.quote(repo_dir)} rev-parse --verify -q HEAD || true"


def final_patch_command(repo_dir: str, out_path: str, base_commit: str | None = None) -> str:
    """Shell command writing the repository's diff (index vs ``base_commit``) to ``out_path``.

    Stages everything first (``git add -A``: new files are included, ignored ones are not)
    and diffs the index against ``base_commit`` (HEAD when None), so commits the agent
    made are part of the patch too. ``--binary`` keeps binary changes applicable.
    """
    base = shlex.quote(base_commit) if base_commit else ""
    return (
        f"set -e; cd {shlex.quote(repo_dir)}; git add -A; "
        f"git -c core.quotepath=off diff --cached --binary --no-color --no-ext-diff {base} "
        f"> {shlex.quote(out_path)}"
    )


def decode_patch(raw: bytes) -> str:
    """Patch bytes as text: UTF-8, undecodable bytes replaced (binary hunks are ASCII)."""
    return raw.decode("utf-8", errors="replace")


def truncate_middle(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping its head and tail."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    elided = len(text) - head - tail
    return (
        f"{text[:head]}\n\n[... {elided} characters elided; the output was too long. "
        f"Use head, tail, grep or sed -n to see less at a time ...]\n\n{text[-tail:]}"
    )

"""The optional LLM grader: a judge model reads a task's rubric and the final state.

Where a task has a ``rubric``, :func:`rubric_grade` shows an OpenAI-compatible judge model
the instruction, the rubric, the agent's final answer and the files of ``/workspace`` the
run created or changed (each cut to ``max_file_chars``, at most ``max_files``), and asks for
``VERDICT: PASS`` or ``VERDICT: FAIL`` with a reason. The programmatic checker stays the
reward; the judge's word is kept beside it (``extra.rubric`` of the trajectory), e.g. to
study where an LLM grader and the checker disagree.
"""

from __future__ import annotations

import re
from typing import Any, Final

import attrs

from orchard_env_client import AsyncSandbox
from orchard_env_client.llm import ChatClient, ModelConfig

from .tasks import WORKSPACE, ClawTask

__all__ = ["RubricVerdict", "changed_files", "judge_prompt", "rubric_grade"]

_VERDICT = re.compile(r"VERDICT\s*:\s*\**\s*(PASS|FAIL)", re.IGNORECASE)
_LIST_FILES: Final = (
    f"cd {WORKSPACE} && find . -type f -size -1M -printf '%P\\n' | sort | head -200"
)

_SYSTEM = """You grade the work of a personal assistant against a rubric. You see the
user's instruction, the rubric, the assistant's final answer and the files it created or
changed. Judge only by the rubric and the evidence shown. End with one line:
VERDICT: PASS or VERDICT: FAIL."""


@attrs.frozen(kw_only=True)
class RubricVerdict:
    """The judge's word on one trial."""

    passed: bool | None
    """None when the judge's reply named no verdict."""
    reason: str
    model: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return attrs.asdict(self)


async def changed_files(
    sandbox: AsyncSandbox, task: ClawTask, *, max_files: int = 20, max_file_chars: int = 4000
) -> dict[str, str]:
    """The workspace files that are new or differ from the task's seed, with their text."""
    job = await sandbox.exec(_LIST_FILES, timeout=60)
    out: dict[str, str] = {}
    for path in job.stdout.splitlines():
        if len(out) >= max_files:
            break
        data = await sandbox.download_content(f"{WORKSPACE}/{path}")
        text = data.decode("utf-8", "replace")
        if task.files.get(path) == text:
            continue
        cut = len(text) - max_file_chars
        out[path] = text if cut <= 0 else text[:max_file_chars] + f"\n... [{cut} more chars]"
    return out


def judge_prompt(task: ClawTask, answer: str, files: dict[str, str]) -> str:
    """The user message the judge gets."""
    shown = "\n\n".join(f"--- {path} ---\n{text}" for path, text in files.items())
    return (
        f"Instruction:\n{task.instruction}\n\nRubric:\n{task.rubric}\n\n"
        f"Final answer:\n{answer or '(none)'}\n\n"
        f"Files created or changed ({len(files)}):\n{shown or '(none)'}"
    )


async def rubric_grade(
    sandbox: AsyncSandbox, task: ClawTask, answer: str, judge: ModelConfig
) -> RubricVerdict | None:
    """The judge's verdict on the final state of ``sandbox`` (None: the task has no rubric)."""
    if not task.rubric:
        return None
    files = await changed_files(sandbox, task)
    messages = [
        {"role": "system", "content": _SYSTEM},
        {"role": "user", "content": judge_prompt(task, answer, files)},
    ]
    async with ChatClient(judge) as chat:
        result = await chat.complete(messages)
    text = str(result.message.get("content") or "")
    found = _VERDICT.findall(text)
    passed = None if not found else found[-1].upper() == "PASS"
    reason = _VERDICT.sub("", text).strip()[:1000]
    return RubricVerdict(passed=passed, reason=reason, model=judge.model)

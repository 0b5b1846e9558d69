"""Our own tool-calling SWE harness (OpenHands / SWE-agent style) over an Orchard sandbox.

The model gets three OpenAI functions: ``bash`` (a command run in the repository; output
merged, truncated head+tail), ``str_replace_based_edit_tool`` (see
:mod:`orchard_swe.harness.editor`) and ``submit`` (ends the episode). The episode ends on
submit, or at ``max_steps`` model calls, ``max_cost`` dollars or ``max_time_s`` seconds.
Model junk never crashes it: a reply without a tool call gets a reminder (and counts as
a step), malformed arguments or unknown tools get an error tool message.

The final patch is the repository's diff in the sandbox (``git add -A`` then the index
against the starting commit), whatever the exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
import traceback
import uuid
from collections.abc import Mapping
from typing import Any, Final

import attrs

from orchard_env_client import (
    AsyncSandbox,
    AuthError,
    ConnectionFailed,
    OrchardError,
    SandboxNotFound,
    SandboxNotReady,
)
from orchard_env_client.llm import INSTANCE_ID_HEADER, ChatClient, ModelConfig, ModelError

from ..trajectory import (
    COST_LIMIT,
    STEP_LIMIT,
    SUBMITTED,
    TIME_LIMIT,
    Trajectory,
    TrajectoryMetadata,
    error_status,
)
from . import PatchError, base_commit_command, decode_patch, final_patch_command, truncate_middle
from .editor import EDITOR_TOOL, EDITOR_TOOL_NAME, SandboxEditor, ToolError

__all__ = [
    "BASH_TOOL",
    "SUBMIT_TOOL",
    "SYSTEM_PROMPT",
    "TOOLS",
    "Episode",
    "SandboxLost",
    "compute_final_patch",
    "head_commit",
    "instance_prompt",
    "run_loop",
    "run_tools_agent",
]

BASH_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": (
            "Run a bash command in the repository directory and return its output (stdout "
            "and stderr merged) and exit code. Each call runs in a fresh shell: `cd` and "
            "environment variables do not persist between calls. Do not run interactive "
            "programs (editors, pagers, prompts); use non-interactive flags. Long outputs "
            "are truncated in the middle, so prefer head, tail, grep and sed -n."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The bash command to run."},
                "timeout": {
                    "type": "integer",
                    "description": "Optional timeout in seconds (default 180).",
                },
            },
            "required": ["command"],
        },
    },
}

SUBMIT_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": (
            "Finish the task. The current state of the repository (every change, including "
            "new files) is submitted as your solution; you cannot act afterwards."
        ),
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}

TOOLS: Final[list[dict[str, Any]]] = [BASH_TOOL, EDITOR_TOOL, SUBMIT_TOOL]
"""The OpenAI tool specs offered to the model."""

SYSTEM_PROMPT: Final = """\
You are an autonomous software engineer. You work in a Linux sandbox on a code repository \
and resolve issues by changing its source code.

You act only through tool calls:
* `bash` runs a shell command in the repository directory;
* `str_replace_based_edit_tool` views, creates and edits files;
* `submit` ends the task: the repository as it is then is your solution.

Every response must contain at least one tool call. Think briefly about what you are doing \
and why, then call a tool. Work step by step: look at the result of each call before \
deciding on the next one."""

_INSTANCE_TEMPLATE: Final = """\
<uploaded_files>
{repo_dir}
</uploaded_files>

A code repository is checked out in {repo_dir}. Consider the following issue:

<issue_description>
{problem_statement}
</issue_description>

Make the minimal changes to the non-test source files in {repo_dir} so that the issue is \
resolved. The tests for this issue are already taken care of: do not modify or add tests, \
and do not change configuration or packaging files unless the issue requires it.

Suggested steps:
1. Explore the repository to find and read the code relevant to the issue.
2. Write a small script that reproduces the problem and run it with bash to confirm it.
3. Edit the source code to fix the problem.
4. Run your script again to check the fix, and think about edge cases; run the existing \
tests that cover the code you changed.
5. Delete every scratch file you created (reproduction scripts, notes): everything left in \
the repository becomes part of your patch.
6. Call `submit`.
"""

NO_TOOL_CALL_REMINDER: Final = (
    "Your last response did not call a tool, so nothing happened. Every response must call "
    "at least one tool: `bash` or `str_replace_based_edit_tool` to keep working, or `submit` "
    "when the issue is resolved."
)

SHELL_ENV: Final[dict[str, str]] = {
    "PAGER": "cat",
    "MANPAGER": "cat",
    "GIT_PAGER": "cat",
    "LESS": "-R",
    "PIP_PROGRESS_BAR": "off",
    "TQDM_DISABLE": "1",
}
"""Environment of every ``bash`` call (no pagers, no progress bars)."""

MAX_BASH_TIMEOUT_S: Final = 1800.0

_FATAL_SANDBOX_ERRORS: Final = (SandboxNotFound, SandboxNotReady, ConnectionFailed, AuthError)


def instance_prompt(problem_statement: str, repo_dir: str) -> str:
    """The first user message: the issue and the working instructions."""
    return _INSTANCE_TEMPLATE.format(problem_statement=problem_statement.strip(), repo_dir=repo_dir)


# ---------------------------------------------------------------- patch


async def head_commit(sandbox: AsyncSandbox, repo_dir: str) -> str | None:
    """The repository's HEAD commit in the sandbox (None if it has none yet)."""
    job = await sandbox.exec(base_commit_command(repo_dir), timeout=60)
    return job.stdout.strip() or None


async def compute_final_patch(
    sandbox: AsyncSandbox, repo_dir: str, base_commit: str | None = None, timeout: float = 300
) -> str:
    """The repository's diff in the sandbox: ``git add -A``, index vs ``base_commit``/HEAD.

    The diff goes through a temp file and the file API, so it is neither truncated like
    command output nor mangled by decoding more than :func:`~orchard_swe.harness.decode_patch`.
    """
    out = f"/tmp/.orchard-patch-{uuid.uuid4().hex}.diff"
    try:
        job = await sandbox.exec(final_patch_command(repo_dir, out, base_commit), timeout=timeout)
        if job.exit_code != 0:
            detail = (job.stderr or job.stdout or job.error or "").strip()
            raise PatchError(f"git diff in {repo_dir} failed (exit {job.exit_code}): {detail}")
        return decode_patch(await sandbox.download_content(out))
    finally:
        with contextlib.suppress(OrchardError):
            await sandbox.exec(["rm", "-f", out], timeout=60)


# ---------------------------------------------------------------- episode


class SandboxLost(Exception):
    """The sandbox is gone or unreachable: the episode cannot go on."""


@attrs.define
class Episode:
    """One tools-harness episode: the sandbox, the editor, the limits and the messages so
    far; :meth:`dispatch` runs one tool call (the credit estimators replay through it)."""

    sandbox: AsyncSandbox
    editor: SandboxEditor
    repo_dir: str
    bash_timeout_s: float
    max_output_chars: int
    deadline: float | None
    messages: list[dict[str, Any]] = attrs.field(factory=list)
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    tool_errors: int = 0

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def add_tool_result(self, call_id: str, content: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})

    async def bash(self, args: Mapping[str, Any]) -> str:
        command = args.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError("Parameter `command` (a non-empty string) is required for `bash`.")
        timeout = self.bash_timeout_s
        if args.get("timeout") is not None:
            raw = args["timeout"]
            if isinstance(raw, bool) or not isinstance(raw, int | float | str):
                raise ToolError(f"Parameter `timeout` must be a number of seconds, got {raw!r}.")
            try:
                timeout = float(raw)
            except ValueError as exc:
                raise ToolError(f"Parameter `timeout` must be a number, got {raw!r}.") from exc
            if timeout <= 0:
                raise ToolError("Parameter `timeout` must be positive.")
        timeout = min(timeout, MAX_BASH_TIMEOUT_S)
        left = self.remaining()
        if left is not None:
            timeout = max(1.0, min(timeout, left))
        job = await self.sandbox.exec(
            "exec 2>&1\n" + command, timeout=timeout, cwd=self.repo_dir, env=SHELL_ENV
        )
        output = job.stdout + job.stderr
        notes = []
        if job.stdout_truncated or job.stderr_truncated:
            notes.append("[The sandbox capped this output; only its beginning was kept.]")
        if job.timed_out:
            notes.append(
                f"[The command timed out after {timeout:g} s and was killed. Avoid long-running "
                "or interactive commands, or pass a larger `timeout`.]"
            )
        elif job.exit_code is None:
            notes.append(f"[The command could not run: {job.error or job.status}]")
        text = truncate_middle(output, self.max_output_chars) if output else "(no output)"
        if notes:
            text = text.rstrip("\n") + "\n" + "\n".join(notes)
        code = "none" if job.exit_code is None else str(job.exit_code)
        return f"{text.rstrip(chr(10))}\n[exit code: {code}]"

    async def dispatch(self, name: str, raw_arguments: Any) -> tuple[str, bool]:
        """Run one tool call; returns (content for the model, whether it was ``submit``)."""
        try:
            args = _decode_arguments(raw_arguments)
            if name == "submit":
                return "Submitted. The task is over.", True
            if name == "bash":
                return await self.bash(args), False
            if name == EDITOR_TOOL_NAME:
                return await self.editor(args), False
            known = ", ".join(t["function"]["name"] for t in TOOLS)
            raise ToolError(f"Unknown tool {name!r}. The tools are: {known}.")
        except ToolError as exc:
            self.tool_errors += 1
            return f"Error: {exc}", False
        except _FATAL_SANDBOX_ERRORS as exc:
            raise SandboxLost(f"{type(exc).__name__}: {exc}") from exc
        except OrchardError as exc:
            self.tool_errors += 1
            return f"Error: the sandbox refused the request: {exc}", False


def _decode_arguments(raw: Any) -> dict[str, Any]:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    if not isinstance(raw, str):
        raise ToolError(f"The tool arguments must be a JSON object, got {type(raw).__name__}.")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ToolError(
            f"The tool arguments are not valid JSON ({exc.msg} at position {exc.pos}). Send "
            'a JSON object such as {"command": "ls"}.'
        ) from exc
    if not isinstance(value, dict):
        raise ToolError(f"The tool arguments must be a JSON object, got {type(value).__name__}.")
    return value


def _assistant_message(raw: Mapping[str, Any], step: int) -> dict[str, Any]:
    """The assistant message as stored and sent back: tool calls normalised, ids filled."""
    message: dict[str, Any] = {"role": "assistant", "content": raw.get("content")}
    if message["content"] is not None and not isinstance(message["content"], str | list):
        message["content"] = str(message["content"])
    calls = raw.get("tool_calls")
    normalised = []
    if isinstance(calls, list):
        for index, call in enumerate(calls):
            if not isinstance(call, Mapping):
                continue
            raw_fn = call.get("function")
            fn: Mapping[str, Any] = raw_fn if isinstance(raw_fn, Mapping) else {}
            arguments = fn.get("arguments", "")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            normalised.append(
                {
                    "id": str(call.get("id") or f"call_{step}_{index}"),
                    "type": "function",
                    "function": {"name": str(fn.get("name") or ""), "arguments": arguments},
                }
            )
    if normalised:
        message["tool_calls"] = normalised
    if raw.get("reasoning_content"):
        message["reasoning_content"] = raw["reasoning_content"]
    return message


async def run_tools_agent(
    sandbox: AsyncSandbox,
    problem_statement: str,
    *,
    model: ModelConfig,
    instance_id: str,
    repo_dir: str = "/workspace/repo",
    max_steps: int = 30,
    max_cost: float = 3.0,
    max_time_s: float = 1800,
    attempt: int = 0,
    bash_timeout_s: float = 180,
    max_output_chars: int = 16_000,
) -> Trajectory:
    """Solve one task with the tool-calling harness; never raises for model or tool junk.

    ``max_steps`` bounds model calls, ``max_cost`` dollars (0 disables) and ``max_time_s``
    wall-clock seconds (0 disables; model calls and commands are cut off at the deadline).
    The returned trajectory's ``final_patch`` is computed in the sandbox after the episode.
    A model error (after the client's retries) or a lost sandbox ends the episode with
    ``exit_status`` ``"error: ..."`` and ``error`` set.
    """
    started_at = time.time()
    t0 = time.monotonic()
    deadline = t0 + max_time_s if max_time_s > 0 else None
    episode = Episode(
        sandbox=sandbox,
        editor=SandboxEditor(sandbox, repo_dir, max_output_chars=max_output_chars),
        repo_dir=repo_dir,
        bash_timeout_s=bash_timeout_s,
        max_output_chars=max_output_chars,
        deadline=deadline,
    )
    episode.messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": instance_prompt(problem_statement, repo_dir)},
    ]
    exit_status: str | None = None
    error: str | None = None
    extra: dict[str, Any] = {"repo_dir": repo_dir}
    base_commit: str | None = None
    try:
        base_commit = await head_commit(sandbox, repo_dir)
        extra["base_commit"] = base_commit
        async with ChatClient(model, headers={INSTANCE_ID_HEADER: instance_id}) as client:
            exit_status = await run_loop(episode, client, max_steps, max_cost)
    except SandboxLost as exc:
        exit_status, error = error_status(f"sandbox lost: {exc}"), str(exc)
    except ModelError as exc:
        exit_status, error = error_status(exc), str(exc)
    except Exception as exc:  # a bug or an unexpected failure: keep the trajectory
        exit_status, error = error_status(exc), str(exc)
        extra["traceback"] = traceback.format_exc()

    final_patch = ""
    try:
        final_patch = await compute_final_patch(sandbox, repo_dir, base_commit)
    except (PatchError, OrchardError) as exc:
        extra["patch_error"] = str(exc)
        error = error or f"final patch: {exc}"
    if "\ufffd" in final_patch:
        extra["patch_lossy_decode"] = True
    extra["tool_errors"] = episode.tool_errors
    finished_at = time.time()
    metadata = TrajectoryMetadata(
        task_id=instance_id,
        recipe="swe",
        harness="tools",
        model=model.model,
        attempt=attempt,
        exit_status=exit_status or error_status("no exit status"),
        steps=episode.steps,
        prompt_tokens=episode.prompt_tokens,
        completion_tokens=episode.completion_tokens,
        cost=episode.cost,
        started_at=started_at,
        finished_at=finished_at,
        duration_s=time.monotonic() - t0,
        final_output=final_patch,
        error=error,
        extra=extra,
    )
    return Trajectory(metadata=metadata, messages=episode.messages, tools=copy.deepcopy(TOOLS))


async def run_loop(episode: Episode, client: ChatClient, max_steps: int, max_cost: float) -> str:
    """Ask the model and run its tool calls until it submits or a limit is hit; the exit
    status."""
    while True:
        if episode.steps >= max_steps:
            return STEP_LIMIT
        if max_cost > 0 and episode.cost >= max_cost:
            return COST_LIMIT
        left = episode.remaining()
        if left is not None and left <= 0:
            return TIME_LIMIT
        try:
            async with asyncio.timeout(left):
                result = await client.complete(episode.messages, TOOLS)
        except TimeoutError:
            return TIME_LIMIT
        episode.steps += 1
        episode.prompt_tokens += result.prompt_tokens
        episode.completion_tokens += result.completion_tokens
        episode.cost += result.cost
        message = _assistant_message(result.message, episode.steps)
        episode.messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            episode.messages.append({"role": "user", "content": NO_TOOL_CALL_REMINDER})
            continue
        submitted = False
        for call in calls:
            name = call["function"]["name"]
            if submitted:
                episode.add_tool_result(
                    call["id"], "Not executed: the task was submitted by an earlier call."
                )
                continue
            content, submitted = await episode.dispatch(name, call["function"]["arguments"])
            episode.add_tool_result(call["id"], content)
        if submitted:
            return SUBMITTED

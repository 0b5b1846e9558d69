"""Running the OpenHands agent on a SWE task in an Orchard sandbox.

:func:`run_openhands_agent` is this harness's counterpart of
:func:`orchard_swe.harness.tools.run_tools_agent`: the OpenHands SDK's own ``Agent`` and
``Conversation``, the stock ``terminal`` and ``file_editor`` tools acting in the sandbox
(:mod:`orchard_openhands.tools`) plus the SDK's built-in ``finish`` and ``think``, and
``LLM(model="openai/<name>", base_url=...)`` for any OpenAI-compatible endpoint. The
conversation runs in a worker thread; its tools call back into the caller's event loop.
When the agent stops without calling ``finish`` (a reply without a tool call) it is told
to go on, as OpenHands' own benchmark runs do, until it finishes or reaches a limit.
The final patch is the sandbox diff, computed like the other harnesses'.

:func:`run_task` is one whole attempt: a sandbox prepared like the other harnesses'
rollouts (``orchard_swe.environment.prepare`` with the history hidden), the agent, then
SWE-bench grading of the patch in a fresh sandbox (``orchard_swe.grading.grade``).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
import time
import traceback
from typing import Any, Final

import attrs
from openhands.sdk import LLM, Agent
from openhands.sdk.conversation import BaseConversation, LocalConversation
from openhands.sdk.event import Event
from openhands.tools.terminal.constants import MAX_CMD_OUTPUT_SIZE
from pydantic import SecretStr

from orchard_env_client import AsyncSandbox, AsyncSandboxClient, OrchardError
from orchard_env_client.llm import INSTANCE_ID_HEADER, ModelConfig
from orchard_swe.distill import graded_attempt
from orchard_swe.environment import WORKSPACE_REPO
from orchard_swe.harness import PatchError
from orchard_swe.harness.tools import compute_final_patch, head_commit
from orchard_swe.tasks import Task
from orchard_swe.trajectory import Trajectory, TrajectoryMetadata, error_status

from .bridge import LoopBridge
from .convert import events_to_messages, exit_status_of, finished, trajectory_from_events
from .editor import SandboxFileEditorExecutor
from .terminal import DEFAULT_COMMAND_TIMEOUT_S, SandboxTerminalExecutor
from .tools import SandboxSession, open_session, tool_specs

__all__ = [
    "CONTINUE_MESSAGE",
    "HARNESS",
    "INSTANCE_TEMPLATE",
    "RunConfig",
    "build_llm",
    "instance_prompt",
    "run_openhands_agent",
    "run_task",
]

HARNESS: Final = "openhands"
"""``metadata.harness`` of this harness's trajectories."""

INSTANCE_TEMPLATE: Final = """\
<uploaded_files>
{repo_dir}
</uploaded_files>

I've uploaded a code repository in the directory {repo_dir}. Consider the following issue \
description:

<issue_description>
{problem_statement}
</issue_description>

Can you help me implement the necessary changes to the repository so that the requirements \
specified in the <issue_description> are met?
I've already taken care of all changes to any of the test files described in the \
<issue_description>. This means you DON'T have to modify the testing logic or any of the \
tests in any way!
Your task is to make the minimal changes to non-test files in the {repo_dir} directory to \
ensure the <issue_description> is satisfied.

Follow these steps to resolve the issue:
1. Explore the repository to find and read the code relevant to the issue.
2. Write a script that reproduces the problem and run it to confirm the error.
3. Edit the source code of the repository to resolve the issue.
4. Rerun your reproduction script and confirm that the error is fixed; think about edge \
cases and run the existing tests that cover the code you changed.
5. Remove the scratch files you created: everything left in {repo_dir} becomes part of \
your change.
6. When you are done, call the `finish` tool.
"""
"""The first user message (after OpenHands' SWE-bench prompt, shortened)."""

CONTINUE_MESSAGE: Final = (
    "Please continue working on the task on whatever approach you think is suitable.\n"
    "When you think you have solved the task, call the `finish` tool.\n"
    "IMPORTANT: YOU SHOULD NEVER ASK FOR HUMAN HELP."
)
"""Sent when the agent stops without calling ``finish`` (OpenHands' benchmark runs send
the same kind of automatic reply)."""

_API_KEY_PLACEHOLDER: Final = "no-key"


def instance_prompt(problem_statement: str, repo_dir: str) -> str:
    """The first user message: the issue and the working instructions."""
    return INSTANCE_TEMPLATE.format(problem_statement=problem_statement.strip(), repo_dir=repo_dir)


def build_llm(model: ModelConfig, instance_id: str, api_key: str | None = None) -> LLM:
    """The SDK's ``LLM`` for ``model`` on its OpenAI-compatible endpoint (chat completions).

    ``api_key`` defaults to ``model.api_key()`` (a placeholder when unset: local servers
    need none). Prices, temperature, token cap, timeout, retries and extra body fields
    come from ``model``; every request carries the ``X-Orchard-Instance-Id`` header.
    """
    key = api_key or model.api_key() or _API_KEY_PLACEHOLDER
    return LLM(
        model=f"openai/{model.model}",
        base_url=model.base_url,
        api_key=SecretStr(key),
        api_mode="chat",
        temperature=model.temperature,
        max_output_tokens=model.max_tokens,
        timeout=max(1, int(model.timeout_s)),
        num_retries=model.max_retries,
        retry_min_wait=max(1, int(model.retry_backoff_s)),
        retry_max_wait=60,
        input_cost_per_token=model.price_per_1k_prompt / 1000.0,
        output_cost_per_token=model.price_per_1k_completion / 1000.0,
        extra_headers={INSTANCE_ID_HEADER: instance_id},
        litellm_extra_body=dict(model.extra_body),
        caching_prompt=False,
        usage_id="agent",
    )


@attrs.define
class _Outcome:
    events: list[Event]
    execution_status: str
    timed_out: bool
    prompt_tokens: int
    completion_tokens: int
    cost: float
    nudges: int
    error: BaseException | None = None
    """What ended the run early (the SDK's ``ConversationRunError``, say); the events and
    usage up to it are kept."""
    error_traceback: str | None = None


_WATCHDOG_TICK_S: Final = 0.2
_CANCEL_GRACE_S: Final = 30.0


class _Stop:
    """When the conversation must stop: a wall-clock deadline, or the caller's cancel.

    A watchdog thread pauses the conversation once either holds and *keeps* pausing it
    until the run is over: the SDK's ``run()`` turns a paused conversation back to
    running, so a single pause that lands between two ``run()`` calls would be undone.
    """

    def __init__(self, max_time_s: float) -> None:
        self.deadline = time.monotonic() + max_time_s if max_time_s > 0 else None
        self.timed_out = threading.Event()
        self.cancelled = threading.Event()
        self.done = threading.Event()

    def due(self) -> bool:
        """Whether the conversation must stop now (and why is recorded)."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.timed_out.set()
        return self.timed_out.is_set() or self.cancelled.is_set()

    def watch(self, conversation: BaseConversation) -> threading.Thread:
        def loop() -> None:
            while not self.done.wait(_WATCHDOG_TICK_S):
                if self.due():
                    conversation.pause()

        thread = threading.Thread(target=loop, name="openhands-watchdog", daemon=True)
        thread.start()
        return thread


def _assistant_turns(events: list[Event]) -> int:
    return sum(1 for m in events_to_messages(events) if m["role"] == "assistant")


def _converse(
    llm: LLM,
    session: SandboxSession,
    prompt: str,
    *,
    max_steps: int,
    max_cost: float,
    stop: _Stop,
) -> _Outcome:
    with (
        tempfile.TemporaryDirectory(prefix="orchard-openhands-") as scratch,
        open_session(session) as key,
    ):
        agent = Agent(llm=llm, tools=tool_specs(key))
        local = LocalConversation(
            agent=agent,
            workspace=scratch,
            max_iteration_per_run=max_steps,
            max_budget_per_run=max_cost if max_cost > 0 else None,
            visualizer=None,
        )
        # the SDK's tracing decorators hide LocalConversation's method signatures from
        # type checkers; its base class declares them
        conversation: BaseConversation = local
        watchdog = stop.watch(conversation)
        nudges = 0
        error: BaseException | None = None
        error_traceback: str | None = None
        try:
            conversation.send_message(prompt)
            while not stop.due():
                try:
                    conversation.run()
                except Exception as exc:  # the model or a tool failed for good: keep the run
                    error, error_traceback = exc, traceback.format_exc()
                    break
                events = list(conversation.state.events)
                status = str(conversation.state.execution_status.value)
                steps = _assistant_turns(events)
                if finished(events) or status != "finished" or steps >= max_steps:
                    break
                nudges += 1
                local.max_iteration_per_run = max_steps - steps
                conversation.send_message(CONTINUE_MESSAGE)
            metrics = conversation.conversation_stats.get_combined_metrics()
            usage = metrics.accumulated_token_usage
            return _Outcome(
                events=list(conversation.state.events),
                execution_status=str(conversation.state.execution_status.value),
                timed_out=stop.timed_out.is_set(),
                prompt_tokens=int(usage.prompt_tokens) if usage else 0,
                completion_tokens=int(usage.completion_tokens) if usage else 0,
                cost=float(metrics.accumulated_cost or 0.0),
                nudges=nudges,
                error=error,
                error_traceback=error_traceback,
            )
        finally:
            stop.done.set()
            watchdog.join()
            conversation.close()


async def _converse_in_thread(
    llm: LLM, session: SandboxSession, prompt: str, *, max_steps: int, max_cost: float, stop: _Stop
) -> _Outcome:
    """:func:`_converse` in a worker thread; cancelling the caller stops the conversation
    (after the model call in flight) and waits a grace period for the thread to end, so
    no thread goes on calling the model for a caller that is gone."""
    worker = asyncio.ensure_future(
        asyncio.to_thread(
            _converse, llm, session, prompt, max_steps=max_steps, max_cost=max_cost, stop=stop
        )
    )
    try:
        return await asyncio.shield(worker)
    except asyncio.CancelledError:
        stop.cancelled.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(worker), _CANCEL_GRACE_S)
        raise


async def run_openhands_agent(
    sandbox: AsyncSandbox,
    problem_statement: str,
    *,
    model: ModelConfig,
    instance_id: str,
    api_key: str | None = None,
    repo_dir: str = WORKSPACE_REPO,
    max_steps: int = 30,
    max_cost: float = 3.0,
    max_time_s: float = 1800,
    attempt: int = 0,
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S,
    max_output_chars: int = MAX_CMD_OUTPUT_SIZE,
) -> Trajectory:
    """Solve one task with the OpenHands agent; never raises for model or tool junk.

    ``max_steps`` (at least 1) bounds model calls, ``max_cost`` dollars (0 disables; needs prices in
    ``model``) and ``max_time_s`` wall-clock seconds (0 disables; the agent is paused
    after the step in progress, commands are cut off at the deadline). The returned
    trajectory's ``final_output`` is the sandbox diff (``git add -A``, index vs the
    starting commit) whatever the exit status; a failure of the harness itself ends the
    episode with ``exit_status`` ``"error: ..."`` and ``error`` set.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps}")
    started_at = time.time()
    t0 = time.monotonic()
    bridge = LoopBridge.current()
    deadline = t0 + max_time_s if max_time_s > 0 else None
    session = SandboxSession(
        terminal=SandboxTerminalExecutor(
            sandbox,
            bridge,
            repo_dir,
            default_timeout_s=command_timeout_s,
            max_output_chars=max_output_chars,
            deadline=deadline,
        ),
        editor=SandboxFileEditorExecutor(
            sandbox, bridge, repo_dir, max_output_chars=max_output_chars
        ),
        repo_dir=repo_dir,
    )
    extra: dict[str, Any] = {"repo_dir": repo_dir}
    metadata = TrajectoryMetadata(
        task_id=instance_id,
        recipe="swe",
        harness=HARNESS,
        model=model.model,
        attempt=attempt,
        started_at=started_at,
    )
    events: list[Event] = []
    base_commit: str | None = None
    try:
        base_commit = await head_commit(sandbox, repo_dir)
        extra["base_commit"] = base_commit
        llm = build_llm(model, instance_id, api_key)
        outcome = await _converse_in_thread(
            llm,
            session,
            instance_prompt(problem_statement, repo_dir),
            max_steps=max_steps,
            max_cost=max_cost,
            stop=_Stop(max_time_s),
        )
        events = outcome.events
        steps = _assistant_turns(events)
        if outcome.error is not None:
            cause = outcome.error.__cause__ or outcome.error
            metadata.exit_status = error_status(cause)
            metadata.error = f"{type(cause).__name__}: {cause}"
            extra["traceback"] = outcome.error_traceback
        else:
            metadata.exit_status, metadata.error = exit_status_of(
                events,
                outcome.execution_status,
                steps=steps,
                max_steps=max_steps,
                timed_out=outcome.timed_out,
            )
        metadata.prompt_tokens = outcome.prompt_tokens
        metadata.completion_tokens = outcome.completion_tokens
        metadata.cost = outcome.cost or model.cost(outcome.prompt_tokens, outcome.completion_tokens)
        extra["openhands"] = {
            "execution_status": outcome.execution_status,
            "continue_messages": outcome.nudges,
            "events": len(events),
        }
    except Exception as exc:  # a harness failure: keep what there is
        metadata.exit_status, metadata.error = error_status(exc), f"{type(exc).__name__}: {exc}"
        extra["traceback"] = traceback.format_exc()
    with contextlib.suppress(OrchardError):  # the terminal's saved state, outside the repo
        await sandbox.exec(["rm", "-f", session.terminal.state_file], timeout=60)
    try:
        metadata.final_output = await compute_final_patch(sandbox, repo_dir, base_commit)
    except (PatchError, OrchardError) as exc:
        extra["patch_error"] = str(exc)
        metadata.error = metadata.error or f"final patch: {exc}"
    if "\ufffd" in metadata.final_output:
        extra["patch_lossy_decode"] = True
    metadata.finished_at = time.time()
    metadata.duration_s = time.monotonic() - t0
    metadata.extra = extra
    return trajectory_from_events(events, metadata)


@attrs.define
class RunConfig:
    """One attempt's settings (see :func:`run_openhands_agent` for the limits)."""

    model: ModelConfig
    api_key: str | None = None
    attempt: int = 0
    max_steps: int = 30
    max_cost: float = 3.0
    max_time_s: float = 1800
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    backend: str | None = None
    default_image: str | None = None
    grade: bool = True


async def run_task(client: AsyncSandboxClient, task: Task, config: RunConfig) -> Trajectory:
    """One graded attempt at ``task`` (see the module doc); errors become the record.

    The verdict is the grading status (``resolved``, ``unresolved``, ...; ``error`` when
    the environment could not be prepared) and ``extra["grading"]`` the full result.
    """

    async def run(sandbox: AsyncSandbox, repo_dir: str) -> Trajectory:
        return await run_openhands_agent(
            sandbox,
            task.problem_statement,
            model=config.model,
            instance_id=task.instance_id,
            api_key=config.api_key,
            repo_dir=repo_dir,
            max_steps=config.max_steps,
            max_cost=config.max_cost,
            max_time_s=config.max_time_s,
            attempt=config.attempt,
            command_timeout_s=config.command_timeout_s,
        )

    return await graded_attempt(
        client,
        task,
        config.attempt,
        run,
        harness=HARNESS,
        model=config.model.model,
        backend=config.backend,
        default_image=config.default_image,
        grade_it=config.grade,
        labels={"orchard-harness": HARNESS},
    )

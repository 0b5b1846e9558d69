"""Value estimators for credit-assignment SFT: Monte-Carlo replay and an LLM judge.

Both implement :class:`orchard_swe.algorithms.credit.Estimator`: ``await values(trajectory)``
returns ``T + 1`` floats for ``T`` assistant turns, ``V[i] ≈ P(resolved | prefix i)``.
:class:`MonteCarloReplay` restores each prefix in a fresh sandbox, lets the recording
harness carry on with the policy ``K`` times and grades each continuation;
:class:`LLMJudge` asks an OpenAI-compatible model for the probability. The steps, what
counts as diverged or failed, striding and the judge's parsing are in
``docs/swe-credit-sft.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import attrs

from orchard_env_client import AsyncSandbox, AsyncSandboxClient, OrchardError
from orchard_env_client.llm import INSTANCE_ID_HEADER, ChatClient, ModelConfig, ModelError

from ..environment import PrepareError, prepare
from ..grading import grade
from ..harness import PatchError
from ..harness.editor import SandboxEditor
from ..harness.tools import (
    SHELL_ENV,
    Episode,
    SandboxLost,
    compute_final_patch,
    head_commit,
    run_loop,
)
from ..tasks import Task
from ..trajectory import SUBMITTED, Trajectory, mini_exit_status
from .credit import assistant_positions

if TYPE_CHECKING:
    from ..environment import EnvironmentSpec

__all__ = [
    "MINI_ACTION_REGEX",
    "Continuation",
    "EstimatorError",
    "JudgeConfig",
    "JudgeError",
    "LLMJudge",
    "MonteCarloConfig",
    "MonteCarloReplay",
    "RecordedAction",
    "ReplayError",
    "Restored",
    "continuation_seed",
    "fill_values",
    "gather_all",
    "parse_probability",
    "planned_prefixes",
    "prefix_end",
    "recorded_actions",
    "render_prefix",
    "restore_prefix",
    "terminal_value",
]

T = TypeVar("T")
Fill = Literal["interpolate", "carry"]

MINI_ACTION_REGEX: Final = re.compile(r"```mswea_bash_command\s*\n(.*?)\n```", re.DOTALL)
"""mini-swe-agent's default ``action_regex`` (``LitellmTextbasedModelConfig``); a reply
acts only when it holds exactly one such block."""

_MINI_SUBMIT_SENTINEL: Final = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# = orchard_swe.harness.mini.SUBMIT_SENTINEL; importing that module loads litellm (~10 s).
_MINI_RETURNCODE: Final = "<returncode>{}</returncode>"


class EstimatorError(RuntimeError):
    """A value estimate could not be made (the message says for which trajectory and why)."""


class ReplayError(EstimatorError):
    """Monte-Carlo replay failed: unknown task, or every continuation of a prefix failed."""


class JudgeError(EstimatorError):
    """The judge endpoint is unreachable, refused the request, or keeps answering garbage.

    ``kind`` is ``"unreachable"`` (no connection / retries exhausted without an answer),
    ``"http"`` (a non-retryable HTTP status or an unreadable response) or
    ``"unparseable"`` (no probability in any answer); ``answer`` is the last answer seen.
    """

    def __init__(
        self, message: str, *, kind: Literal["unreachable", "http", "unparseable"], answer: str = ""
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.answer = answer


# ---------------------------------------------------------------- prefixes and curves


def prefix_end(messages: Sequence[Mapping[str, Any]], prefix: int) -> int:
    """The number of messages in prefix ``prefix`` (before assistant turn ``prefix``)."""
    positions = assistant_positions(messages)
    if not 0 <= prefix <= len(positions):
        raise ValueError(f"prefix {prefix} is outside 0..{len(positions)}")
    return positions[prefix] if prefix < len(positions) else len(messages)


def planned_prefixes(turns: int, stride: int = 1) -> list[int]:
    """The prefixes estimated for ``turns`` turns: every ``stride``-th, plus the last."""
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if turns < 0:
        raise ValueError(f"turns must be >= 0, got {turns}")
    return sorted({*range(0, turns + 1, stride), turns})


def fill_values(turns: int, known: Mapping[int, float], mode: Fill = "interpolate") -> list[float]:
    """The curve ``V[0..turns]`` from the estimated points ``known`` (which must hold 0).

    ``interpolate``: linear between the nearest known points on either side (after the
    last known point, its value carries). ``carry``: the last known value before it.
    """
    if 0 not in known:
        raise ValueError("the value of prefix 0 must be known")
    if mode not in ("interpolate", "carry"):
        raise ValueError(f"unknown fill mode {mode!r}")
    points = sorted(p for p in known if 0 <= p <= turns)
    out: list[float] = []
    for i in range(turns + 1):
        before = max(p for p in points if p <= i)
        after = [p for p in points if p >= i]
        if i == before or mode == "carry" or not after:
            out.append(float(known[before]))
            continue
        nxt = after[0]
        w = (i - before) / (nxt - before)
        out.append((1.0 - w) * known[before] + w * known[nxt])
    return out


def continuation_seed(base: int, instance_id: str, attempt: int, prefix: int, index: int) -> int:
    """A stable 31-bit seed for one continuation (the same on every run and machine)."""
    key = f"{base}|{instance_id}|{attempt}|{prefix}|{index}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big") & 0x7FFFFFFF


def terminal_value(trajectory: Trajectory) -> float | None:
    """V of the whole trajectory when it is known exactly: submitted and graded."""
    meta = trajectory.metadata
    if meta.exit_status != SUBMITTED or meta.verdict is None:
        return None
    return 1.0 if meta.verdict == "resolved" else 0.0


async def gather_all(coroutines: Iterable[Awaitable[T]]) -> list[T]:
    """Like ``asyncio.gather``, but on a failure or a cancellation every other task is
    cancelled (once) and awaited, so their ``finally`` blocks (which delete sandboxes) have
    finished before this raises."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            if not task.done() and not task.cancelling():  # gather may have cancelled it
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


# ---------------------------------------------------------------- recorded actions


@attrs.frozen
class RecordedAction:
    """One action of an assistant message: a tool call, or a text (mini) bash command."""

    name: str
    """``bash``, ``str_replace_based_edit_tool``, ``submit`` (or another tool's name)."""
    arguments: Any
    """The tool call's arguments as recorded (a JSON string), or ``{"command": ...}``."""
    call_id: str = ""
    """The tool call's id (empty for a text action)."""


def recorded_actions(message: Mapping[str, Any]) -> list[RecordedAction]:
    """The actions an assistant message took, in order.

    Tool calls, when present; otherwise mini-swe-agent's text protocol: the command of the
    reply's single ``mswea_bash_command`` block (a reply with none or several did not act).
    """
    calls = message.get("tool_calls") or []
    if calls:
        return [
            RecordedAction(
                name=str((call.get("function") or {}).get("name", "")),
                arguments=(call.get("function") or {}).get("arguments", ""),
                call_id=str(call.get("id") or ""),
            )
            for call in calls
            if isinstance(call, Mapping)
        ]
    content = message.get("content")
    blocks = MINI_ACTION_REGEX.findall(content) if isinstance(content, str) else []
    if len(blocks) != 1:
        return []
    return [RecordedAction(name="bash", arguments={"command": blocks[0].strip()})]


def _recorded_observation(
    messages: Sequence[Mapping[str, Any]], position: int, action: RecordedAction
) -> str | None:
    """What the recording saw for ``action`` of the assistant message at ``position``."""
    for message in messages[position + 1 :]:
        role = message.get("role")
        if role == "assistant":
            return None
        if action.call_id and role == "tool" and message.get("tool_call_id") == action.call_id:
            return str(message.get("content") or "")
        if not action.call_id and role == "user":
            return str(message.get("content") or "")
    return None


@attrs.define
class Restored:
    """What re-executing a prefix did."""

    actions: int = 0
    """Actions re-executed."""
    diverged: int = 0
    """Of those, how many gave an observation other than the recorded one."""
    submitted: bool = False
    """The prefix ends with a submission (nothing may follow)."""


async def _replay_tools_action(episode: Episode, action: RecordedAction) -> tuple[str, bool]:
    return await episode.dispatch(action.name, action.arguments)


async def _replay_mini_action(episode: Episode, action: RecordedAction) -> tuple[str, bool]:
    """mini: a bash command; it submits when its output starts with mini's sentinel."""
    args = action.arguments
    if isinstance(args, str):
        with contextlib.suppress(json.JSONDecodeError):
            args = json.loads(args)
    command = str(args.get("command", "")) if isinstance(args, Mapping) else ""
    if not command:
        return "", False
    job = await episode.sandbox.exec(
        "exec 2>&1\n" + command, cwd=episode.repo_dir, timeout=episode.bash_timeout_s, env=SHELL_ENV
    )
    output = job.stdout + job.stderr
    first = output.lstrip().splitlines()[:1]
    submitted = job.exit_code == 0 and first == [_MINI_SUBMIT_SENTINEL]
    return _MINI_RETURNCODE.format(job.exit_code), submitted


def _same(harness: str, replayed: str, recorded: str) -> bool:
    """tools: the exact tool message; mini: the same return code in the observation."""
    return replayed == recorded if harness == "tools" else replayed in recorded


async def restore_prefix(
    episode: Episode, messages: Sequence[Mapping[str, Any]], prefix: int, harness: str
) -> Restored:
    """Re-execute the actions of turns ``0..prefix-1`` in ``episode``'s sandbox, in order.

    ``harness`` is the trajectory's (``tools`` or ``mini``). Stops at a submission.
    """
    replay = _replay_tools_action if harness == "tools" else _replay_mini_action
    out = Restored()
    end = prefix_end(messages, prefix)
    for position in assistant_positions(messages[:end]):
        for action in recorded_actions(messages[position]):
            observation, submitted = await replay(episode, action)
            out.actions += 1
            recorded = _recorded_observation(messages, position, action)
            if recorded is not None and not _same(harness, observation, recorded):
                out.diverged += 1
            if submitted:
                out.submitted = True
                return out
    return out


# ---------------------------------------------------------------- continuations


async def _continue_tools(
    episode: Episode,
    prefix: list[dict[str, Any]],
    model: ModelConfig,
    instance_id: str,
    cfg: MonteCarloConfig,
) -> str:
    """The tools harness's own loop, resumed from ``prefix``; its exit status."""
    episode.messages = prefix
    episode.deadline = time.monotonic() + cfg.max_time_s
    async with ChatClient(model, headers={INSTANCE_ID_HEADER: instance_id}) as chat:
        return await run_loop(episode, chat, cfg.max_steps, 0.0)


def _continue_mini(
    base_url: str,
    sandbox_id: str,
    repo_dir: str,
    prefix: list[dict[str, Any]],
    model: ModelConfig,
    instance_id: str,
    mini_config: str,
    cfg: MonteCarloConfig,
) -> str:
    """mini-swe-agent's ``DefaultAgent`` resumed from ``prefix`` (blocking: run in a thread).

    The agent starts as mini always does, except that the system and task messages it adds
    first are replaced by the prefix's messages; ``step_limit`` counts continuation calls.
    """
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models import get_model

    from orchard_env_client import SandboxClient

    from ..harness.mini import OrchardEnvironment, build_mini_config

    class ResumedAgent(DefaultAgent):
        def add_messages(self, *messages: dict[str, Any]) -> list[dict[str, Any]]:
            nonlocal prefix
            if prefix:
                messages, prefix = tuple(prefix), []
            return super().add_messages(*messages)

    config = build_mini_config(
        model=model,
        instance_id=instance_id,
        repo_dir=repo_dir,
        step_limit=cfg.max_steps,
        cost_limit=0.0,
        time_limit_s=cfg.max_time_s,
        mini_config=mini_config,
        command_timeout=int(cfg.bash_timeout_s),
    )
    config["model"]["model_kwargs"].setdefault("api_key", model.api_key() or "no-key")
    with SandboxClient(base_url=base_url, auto_cleanup=False) as sync:
        env = OrchardEnvironment(sandbox=sync.get_sandbox(sandbox_id), **config["environment"])
        agent = ResumedAgent(get_model(config=config["model"]), env, **config["agent"])
        result = agent.run("")
    return mini_exit_status(
        str(result.get("exit_status") or ""),
        steps=agent.n_calls,
        step_limit=cfg.max_steps,
        cost=agent.cost,
        cost_limit=0.0,
    )


@attrs.frozen(kw_only=True)
class MonteCarloConfig:
    """How many continuations, of which prefixes, with what limits."""

    k: int = 4
    """Continuations per prefix."""
    stride: int = 1
    """Estimate every ``stride``-th prefix (and always the first and the last)."""
    fill: Fill = "interpolate"
    """How the prefixes skipped by ``stride`` get a value (:func:`fill_values`)."""
    max_steps: int = 10
    """Model calls per continuation."""
    max_time_s: float = 900.0
    """Wall time of one continuation's agent loop."""
    bash_timeout_s: float = 180.0
    """Per command, when replaying and continuing."""
    max_output_chars: int = 16_000
    """Tool output cut (tools harness), as the recording harness used by default."""
    concurrency: int = 4
    """Continuations in flight; each holds one sandbox at a time (its own, then grading's)."""
    seed: int = 0
    """Base of the per-continuation seeds (:func:`continuation_seed`)."""
    terminal_from_metadata: bool = True
    """Take a submitted, graded trajectory's last value from its verdict (no rollout)."""
    default_image: str | None = None
    mini_config: str | None = None
    """mini-swe-agent config for mini trajectories (default: the one they recorded, else
    mini's ``swebench_backticks.yaml``)."""

    def __attrs_post_init__(self) -> None:
        if self.k < 1 or self.stride < 1 or self.concurrency < 1 or self.max_steps < 1:
            raise ValueError("k, stride, concurrency and max_steps must be >= 1")
        if self.fill not in ("interpolate", "carry"):
            raise ValueError(f"unknown fill mode {self.fill!r}")


@attrs.frozen(kw_only=True)
class Continuation:
    """One continuation of one prefix: how it ended and how it was graded."""

    instance_id: str
    attempt: int
    prefix: int
    index: int
    seed: int
    status: str
    """The grading status (``resolved``, ``unresolved``, ...), or ``error`` when it failed."""
    exit_status: str = ""
    """How the continuation's agent loop ended (``submitted``, ``step_limit``, ...; mini's
    statuses mapped as for trajectories)."""
    restored_actions: int = 0
    diverged: int = 0
    error: str | None = None
    """Why the continuation failed (it is then left out of the value)."""
    duration_s: float = 0.0

    @property
    def resolved(self) -> bool:
        """Whether grading said ``resolved``."""
        return self.status == "resolved"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return attrs.asdict(self)


class _ContinuationFailed(Exception):
    """mini-swe-agent's run raised (its model or environment failed)."""


_INFRA_ERRORS: Final = (
    PrepareError,
    OrchardError,
    PatchError,
    ModelError,
    SandboxLost,
    _ContinuationFailed,
)


async def _delete(sandbox: AsyncSandbox) -> None:
    """Delete ``sandbox`` and wait until it is gone, even through cancellations (a
    cancellation that arrives meanwhile is re-raised afterwards)."""
    deletion = asyncio.ensure_future(sandbox.delete())
    cancelled = False
    while not deletion.done():
        try:
            await asyncio.shield(deletion)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:  # already gone, or the service failed: nothing more to do
            break
    if not deletion.cancelled():
        deletion.exception()  # retrieved: a failed deletion is not an unhandled error
    if cancelled:
        raise asyncio.CancelledError


class MonteCarloReplay:
    """``V(prefix)`` = the resolved fraction of ``k`` policy continuations of the restored
    prefix (see the module docstring).

    ``tasks`` are the trajectories' tasks (by ``instance_id``); ``policy`` the continuing
    model (its ``extra_body`` gets each continuation's ``seed``; use a temperature > 0, or
    all ``k`` continuations may be the same). Every continuation run is appended to
    :attr:`continuations`; ``on_unit`` is called after each (progress reporting).
    """

    def __init__(
        self,
        client: AsyncSandboxClient,
        tasks: Iterable[Task],
        policy: ModelConfig,
        config: MonteCarloConfig | None = None,
        *,
        on_unit: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.tasks = {t.instance_id: t for t in tasks}
        self.policy = policy
        self.config = config or MonteCarloConfig()
        self.on_unit = on_unit
        self.continuations: list[Continuation] = []
        self._gate = asyncio.Semaphore(self.config.concurrency)
        self._backend: str | None = None

    def plan(self, trajectory: Trajectory) -> list[tuple[int, int]]:
        """The ``(prefix, k)`` pairs :meth:`values` rolls out (k continuations per prefix)."""
        turns = len(assistant_positions(trajectory.messages))
        plan = []
        for prefix in planned_prefixes(turns, self.config.stride):
            if prefix == turns and trajectory.metadata.exit_status == SUBMITTED:
                exact = (
                    self.config.terminal_from_metadata and terminal_value(trajectory) is not None
                )
                plan.append((prefix, 0 if exact else 1))  # a submitted end is deterministic
            else:
                plan.append((prefix, self.config.k))
        return plan

    def units(self, trajectory: Trajectory) -> int:
        """Continuations :meth:`values` runs for ``trajectory``."""
        return sum(k for _, k in self.plan(trajectory))

    async def values(self, trajectory: Trajectory) -> list[float]:
        """``T + 1`` values (estimated prefixes per :meth:`plan`, the rest filled)."""
        task = self._task(trajectory)
        if self._backend is None:
            self._backend = (await self.client.health()).backend
        plan = self.plan(trajectory)
        runs = [(p, j) for p, k in plan for j in range(k)]
        results = await gather_all(self._continuation(trajectory, task, p, j) for p, j in runs)
        known = {
            p: self._value(trajectory, p, [r for r in results if r.prefix == p]) for p, _ in plan
        }
        return fill_values(plan[-1][0], known, self.config.fill)

    def _task(self, trajectory: Trajectory) -> Task:
        instance_id = trajectory.metadata.task_id
        if instance_id not in self.tasks:
            raise ReplayError(f"{instance_id}: no such task among the {len(self.tasks)} given")
        if trajectory.metadata.harness not in ("tools", "mini"):
            raise ReplayError(
                f"{instance_id}: cannot replay harness {trajectory.metadata.harness!r}"
            )
        return self.tasks[instance_id]

    def _value(self, trajectory: Trajectory, prefix: int, results: list[Continuation]) -> float:
        exact = terminal_value(trajectory)
        if not results and exact is not None:  # the end of a submitted, graded trajectory
            return exact
        ok = [r for r in results if r.error is None]
        if not ok:
            meta, first = trajectory.metadata, results[0].error if results else None
            raise ReplayError(
                f"{meta.task_id} (attempt {meta.attempt}): all {len(results)} "
                f"continuations of prefix {prefix} failed; first: {first}"
            )
        return sum(r.resolved for r in ok) / len(ok)

    async def _continuation(
        self, trajectory: Trajectory, task: Task, prefix: int, index: int
    ) -> Continuation:
        meta = trajectory.metadata
        seed = continuation_seed(self.config.seed, meta.task_id, meta.attempt, prefix, index)
        fields: dict[str, Any] = {
            "instance_id": meta.task_id,
            "attempt": meta.attempt,
            "prefix": prefix,
            "index": index,
            "seed": seed,
        }
        async with self._gate:
            started = time.monotonic()  # sandbox time, not time queued at the gate
            try:
                patch, restored, exit_status = await self._explore(trajectory, task, prefix, seed)
                status = await self._grade(task, patch)
            except _INFRA_ERRORS as exc:
                result = Continuation(
                    **fields,
                    status="error",
                    error=f"{type(exc).__name__}: {exc}",
                    duration_s=time.monotonic() - started,
                )
            else:
                result = Continuation(
                    **fields,
                    status=status,
                    exit_status=exit_status,
                    restored_actions=restored.actions,
                    diverged=restored.diverged,
                    duration_s=time.monotonic() - started,
                )
        self.continuations.append(result)
        if self.on_unit is not None:
            self.on_unit()
        return result

    async def _explore(
        self, trajectory: Trajectory, task: Task, prefix: int, seed: int
    ) -> tuple[str, Restored, str]:
        """Restore the prefix in a fresh sandbox, continue, take the diff; delete the sandbox."""
        cfg = self.config
        sandbox, spec = await prepare(
            self.client,
            task,
            backend=self._backend,
            default_image=cfg.default_image,
            hide_history=True,
            labels={"orchard-swe-role": "mc-replay"},
        )
        try:
            self._check_repo_dir(trajectory, spec)
            base = await head_commit(sandbox, spec.repo_dir)
            episode = Episode(
                sandbox=sandbox,
                repo_dir=spec.repo_dir,
                deadline=None,
                editor=SandboxEditor(sandbox, spec.repo_dir, max_output_chars=cfg.max_output_chars),
                bash_timeout_s=cfg.bash_timeout_s,
                max_output_chars=cfg.max_output_chars,
            )
            harness = trajectory.metadata.harness
            restored = await restore_prefix(episode, trajectory.messages, prefix, harness)
            exit_status = SUBMITTED
            if not restored.submitted:
                exit_status = await self._continue(trajectory, episode, prefix, seed)
            patch = await compute_final_patch(sandbox, spec.repo_dir, base)
        finally:
            await _delete(sandbox)
        return patch, restored, exit_status

    @staticmethod
    def _check_repo_dir(trajectory: Trajectory, spec: EnvironmentSpec) -> None:
        recorded = trajectory.metadata.extra.get("repo_dir")
        if recorded and recorded != spec.repo_dir:
            raise ReplayError(
                f"{trajectory.metadata.task_id} was recorded in {recorded}, "
                f"but this service puts the repository in {spec.repo_dir}"
            )

    async def _continue(
        self, trajectory: Trajectory, episode: Episode, prefix: int, seed: int
    ) -> str:
        model = attrs.evolve(self.policy, extra_body={**self.policy.extra_body, "seed": seed})
        messages = [dict(m) for m in trajectory.messages[: prefix_end(trajectory.messages, prefix)]]
        instance_id = trajectory.metadata.task_id
        if trajectory.metadata.harness == "tools":
            return await _continue_tools(episode, messages, model, instance_id, self.config)
        recorded = trajectory.metadata.extra.get("mini_config")
        mini_config = self.config.mini_config or (
            recorded
            if isinstance(recorded, str) and recorded != "(dict)"
            else "swebench_backticks.yaml"
        )
        try:
            return await asyncio.to_thread(
                _continue_mini,
                self.client.base_url,
                episode.sandbox.sandbox_id,
                episode.repo_dir,
                messages,
                model,
                instance_id,
                mini_config,
                self.config,
            )
        except Exception as exc:  # mini re-raises whatever ended its run
            raise _ContinuationFailed(f"mini-swe-agent: {type(exc).__name__}: {exc}") from exc

    async def _grade(self, task: Task, patch: str) -> str:
        if not patch.strip():
            return "unresolved"
        result = await grade(
            self.client, task, patch, backend=self._backend, default_image=self.config.default_image
        )
        return result.status

    def stats(self) -> dict[str, Any]:
        """Totals over every continuation run so far."""
        runs = self.continuations
        return {
            "continuations": len(runs),
            "errors": sum(r.error is not None for r in runs),
            "resolved": sum(r.resolved for r in runs),
            "restored_actions": sum(r.restored_actions for r in runs),
            "diverged": sum(r.diverged for r in runs),
            "sandbox_seconds": round(sum(r.duration_s for r in runs), 1),
        }


# ---------------------------------------------------------------- LLM judge

_NUMBER = re.compile(
    r"(?<![\w.])(?P<num>[+-]?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][+-]?\d+)?)(?!\.\d)(?![\w])"
    r"(?:\s*(?P<pct>%|percent\b))?"
)
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)


def parse_probability(text: str) -> float | None:
    """The first probability in ``text``: a number in ``[0, 1]`` or a percentage in
    ``[0, 100]`` (``%`` or ``percent``); None if there is none.

    ``<think>...</think>`` blocks are ignored; numbers outside the range (``7``, ``-0.2``,
    ``150%``) and parts of words or versions (``gpt4``, ``1.2.3``) are skipped.
    """
    for match in _NUMBER.finditer(_THINK.sub(" ", text)):
        value = float(match.group("num"))
        if not math.isfinite(value):
            continue
        if match.group("pct"):
            if 0.0 <= value <= 100.0:
                return value / 100.0
        elif 0.0 <= value <= 1.0:
            return value
    return None


def _elide(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit // 3
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters elided ...]\n{text[-tail:]}"


def _message_text(message: Mapping[str, Any], limit: int) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content) if content else ""
    for call in message.get("tool_calls") or []:
        fn = (call.get("function") or {}) if isinstance(call, Mapping) else {}
        text += f"\n<tool_call name={json.dumps(str(fn.get('name', '')))}>{fn.get('arguments', '')}</tool_call>"
    return _elide(text.strip(), limit)


def render_prefix(
    messages: Sequence[Mapping[str, Any]],
    prefix: int,
    *,
    max_chars: int = 24_000,
    max_message_chars: int = 3_000,
) -> tuple[str, str]:
    """``(task, transcript)`` of prefix ``prefix``: the first user message, and the turns
    after it as ``[role]`` blocks (each cut to ``max_message_chars``, the whole transcript
    to ``max_chars``; the middle is elided)."""
    end = prefix_end(messages, prefix)
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    task = _message_text(messages[first_user], max_chars) if first_user is not None else ""
    start = first_user + 1 if first_user is not None else 0
    blocks = [
        f"[{m.get('role', '?')}]\n{_message_text(m, max_message_chars)}"
        for m in messages[start:end]
        if m.get("role") != "system"
    ]
    return task, _elide("\n\n".join(blocks), max_chars)


JUDGE_SYSTEM_PROMPT: Final = (
    "You estimate how likely a software-engineering agent is to succeed. You see a task (an "
    "issue in a code repository) and the beginning of an agent's attempt at it: its messages, "
    "the commands it ran and their outputs. Estimate the probability that the attempt, carried "
    "on from this point, ends with a patch that resolves the issue (the issue's tests pass). "
    "Reply with a single number between 0 and 1 and nothing else."
)
_JUDGE_QUESTION: Final = (
    '<task>\n{task}\n</task>\n\n<attempt turns="{turns}">\n{transcript}\n</attempt>\n\n'
    "The attempt so far has {turns} agent turn(s){ending}. What is the probability that it "
    "resolves the issue? Reply with one number between 0 and 1."
)
_JUDGE_REMINDER: Final = "Reply with only the probability: one number between 0 and 1, e.g. 0.35."


@attrs.frozen(kw_only=True)
class JudgeConfig:
    """How the judge is asked and how its answers are read."""

    retries: int = 2
    """Re-asks after an unparseable answer (the HTTP client retries transient errors itself)."""
    on_unparseable: float | None = None
    """None: raise :class:`JudgeError` when no answer parses; a value in [0, 1]: use it."""
    concurrency: int = 4
    """Requests in flight."""
    max_chars: int = 24_000
    """Transcript budget (characters) of the prompt."""
    max_message_chars: int = 3_000
    max_tokens: int | None = 64
    """Answer length (None: the server's default; reasoning models need more)."""
    terminal_from_metadata: bool = True
    """Take a submitted, graded trajectory's last value from its verdict (no request)."""

    def __attrs_post_init__(self) -> None:
        if self.retries < 0 or self.concurrency < 1:
            raise ValueError("retries must be >= 0 and concurrency >= 1")
        if self.on_unparseable is not None and not 0.0 <= self.on_unparseable <= 1.0:
            raise ValueError(f"on_unparseable must be in [0, 1], got {self.on_unparseable}")


class LLMJudge:
    """``V(prefix)`` = an LLM's stated ``P(resolved | prefix)`` (see the module docstring).

    ``model`` is the judge endpoint (its ``temperature``, ``max_retries`` for transient HTTP
    errors and ``extra_body`` apply; ``max_tokens`` comes from ``config``). ``answers``
    collects ``(instance_id, attempt, prefix, answer, value)`` of every answered prefix;
    ``unparsed`` counts prefixes that fell back to ``on_unparseable``.
    """

    def __init__(
        self,
        model: ModelConfig,
        config: JudgeConfig | None = None,
        *,
        on_unit: Callable[[], None] | None = None,
    ) -> None:
        self.config = config or JudgeConfig()
        self.model = attrs.evolve(model, max_tokens=self.config.max_tokens)
        self.on_unit = on_unit
        self.answers: list[tuple[str, int, int, str, float]] = []
        self.unparsed = 0
        self._gate = asyncio.Semaphore(self.config.concurrency)

    def _exact_end(self, trajectory: Trajectory) -> float | None:
        return terminal_value(trajectory) if self.config.terminal_from_metadata else None

    def units(self, trajectory: Trajectory) -> int:
        """Requests :meth:`values` sends for ``trajectory`` (before re-asks)."""
        turns = len(assistant_positions(trajectory.messages))
        return turns + (0 if self._exact_end(trajectory) is not None else 1)

    async def values(self, trajectory: Trajectory) -> list[float]:
        """``T + 1`` values, one request per prefix (the exact end of a graded submission)."""
        turns = len(assistant_positions(trajectory.messages))
        exact = self._exact_end(trajectory)
        asked = range(turns) if exact is not None else range(turns + 1)
        headers = {INSTANCE_ID_HEADER: trajectory.metadata.task_id}
        async with ChatClient(self.model, headers=headers) as chat:
            values = await gather_all(self._ask(chat, trajectory, p) for p in asked)
        return values if exact is None else [*values, exact]

    def question(self, trajectory: Trajectory, prefix: int) -> list[dict[str, Any]]:
        """The chat messages asking about prefix ``prefix``."""
        task, transcript = render_prefix(
            trajectory.messages,
            prefix,
            max_chars=self.config.max_chars,
            max_message_chars=self.config.max_message_chars,
        )
        turns = len(assistant_positions(trajectory.messages))
        ending = (
            "; the agent then submitted its work"
            if (prefix == turns and trajectory.metadata.exit_status == SUBMITTED)
            else ""
        )
        text = _JUDGE_QUESTION.format(
            task=task, transcript=transcript or "(nothing yet)", turns=prefix, ending=ending
        )
        return [
            {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
            {"role": "user", "content": text},
        ]

    async def _ask(self, chat: ChatClient, trajectory: Trajectory, prefix: int) -> float:
        meta = trajectory.metadata
        where = f"{meta.task_id} (attempt {meta.attempt}), prefix {prefix}"
        messages = self.question(trajectory, prefix)
        answer = ""
        async with self._gate:
            for _ in range(self.config.retries + 1):
                answer = await self._complete(chat, messages, where)
                value = parse_probability(answer)
                if value is not None:
                    self.answers.append((meta.task_id, meta.attempt, prefix, answer, value))
                    self._done()
                    return value
                messages = [
                    *messages,
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": _JUDGE_REMINDER},
                ]
        if self.config.on_unparseable is None:
            raise JudgeError(
                f"{where}: no probability in {self.config.retries + 1} answer(s); "
                f"last: {answer[:200]!r}",
                kind="unparseable",
                answer=answer,
            )
        self.unparsed += 1
        self._done()
        return self.config.on_unparseable

    async def _complete(self, chat: ChatClient, messages: list[dict[str, Any]], where: str) -> str:
        try:
            result = await chat.complete(messages)
        except ModelError as exc:
            kind: Literal["unreachable", "http"] = (
                "unreachable" if exc.status_code is None else "http"
            )
            raise JudgeError(
                f"{where}: the judge at {self.model.base_url} failed: {exc}", kind=kind
            ) from exc
        content = result.message.get("content")
        return content if isinstance(content, str) else ""

    def _done(self) -> None:
        if self.on_unit is not None:
            self.on_unit()

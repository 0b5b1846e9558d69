"""A ReAct browser agent: any OpenAI-compatible vision chat model drives the sandbox's Chromium.

Each turn the model sees the instruction (first turn), the result of its last action, the
page's URL, title and tabs, the numbered interactive elements (Set-of-Mark, as text) and
the last ``history_screenshots`` screenshots as image parts; older screenshots are replaced
by a placeholder so the context stays bounded. It answers with one action: a function-tool
call (``action_format="tools"``, one tool per action kind) or a text line
(``action_format="text"``, see :mod:`orchard_gui.text_actions`). A reply without a usable
action gets the parse error back; ``max_format_errors`` such replies in a row end the
episode (``format_error``). ``done`` ends it (``submitted``); so do the step and time
limits (``step_limit``, ``time_limit``). A failed browser action is shown to the model and
the episode goes on; a browser or sandbox failure ends it as ``error: ...`` with
everything recorded so far kept.

The episode is returned as an :class:`orchard_env_client.trajectory.Trajectory` (recipe
``gui``): the conversation with screenshots referenced as ``artifact:`` files written
under ``<run_dir>/artifacts/<task>/<attempt>/``, one step per action with the observation
after it, and the task's programmatic reward when it has one.
"""

from __future__ import annotations

import asyncio
import base64
import re
import time
import uuid
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal

import attrs

from orchard_env_client import AsyncSandbox
from orchard_env_client.llm import INSTANCE_ID_HEADER, ChatClient, ChatResult, ModelConfig
from orchard_env_client.trajectory import (
    FORMAT_ERROR,
    STEP_LIMIT,
    SUBMITTED,
    TIME_LIMIT,
    ArtifactWriter,
    Trajectory,
    TrajectoryMetadata,
    TrajectoryStep,
    artifact_url,
    error_status,
)

from .actions import Action, ActionError, action_from_tool_call, action_tools
from .browser import BrowserSession, Mark, Observation
from .tasks import WebTask, episode_for
from .text_actions import parse_text_action

__all__ = [
    "HARNESS_NAME",
    "HarnessConfig",
    "observation_text",
    "run_episode",
    "system_prompt",
]

HARNESS_NAME: Final = "react"
_OMITTED: Final = "[an earlier screenshot, omitted to save context]"
_OLD_DETAIL_MARKERS: Final = ("\nInteractive elements (", "\nAccessibility tree:")
REWARD_TIMEOUT_S: Final = 60.0
_MAX_LINE: Final = 200


@attrs.define(frozen=True, kw_only=True)
class HarnessConfig:
    """How the agent runs an episode."""

    max_steps: int = attrs.field(default=30, validator=attrs.validators.ge(1))
    """Model calls per episode (a reply without a usable action counts too)."""
    max_time_s: float = attrs.field(default=300.0, validator=attrs.validators.gt(0))
    """Wall-clock limit of one episode, model calls and browser actions together."""
    history_screenshots: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    """How many of the most recent screenshots the model sees."""
    action_format: Literal["tools", "text"] = attrs.field(
        default="tools", validator=attrs.validators.in_(("tools", "text"))
    )
    marks: bool = True
    """List the numbered interactive elements (with their centres) in each observation."""
    som_overlay: bool = False
    """Show the screenshot with the numbered boxes drawn on it instead of the plain one."""
    axtree: bool = False
    """Add the page's accessibility tree (text) to each observation."""
    max_marks: int = 120
    """Most element lines shown per observation."""
    max_format_errors: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    """Replies in a row without a usable action before the episode ends."""
    system_prompt: str | None = None
    """Replaces the packaged prompt (``{width}`` / ``{height}`` are filled in)."""


def system_prompt(config: HarnessConfig, viewport: tuple[int, int]) -> str:
    """The system prompt for ``config`` (the packaged one unless overridden)."""
    text = config.system_prompt
    if text is None:
        name = "react_tools.txt" if config.action_format == "tools" else "react_text.txt"
        text = resources.files("orchard_gui").joinpath("prompts", name).read_text("utf-8")
    return text.replace("{width}", str(viewport[0])).replace("{height}", str(viewport[1]))


def _mark_line(mark: Mark) -> str:
    cx, cy = mark.center
    name = " ".join(mark.name.split())[:80]
    return f'[{mark.id}] {mark.role or mark.tag} "{name}" at ({round(cx)}, {round(cy)})'


def observation_text(obs: Observation, config: HarnessConfig) -> str:
    """The text part of an observation as the model sees it."""
    lines = [f"URL: {obs.url[:_MAX_LINE]}", f"Title: {' '.join(obs.title.split())[:_MAX_LINE]}"]
    if len(obs.tabs) > 1:
        tabs = ", ".join(
            f"[{t.get('index')}]{'*' if t.get('active') else ''} {str(t.get('title') or t.get('url'))[:40]}"
            for t in obs.tabs
        )
        lines.append(f"Tabs (* = active): {tabs}")
    if config.marks and obs.marks is not None:
        shown = obs.marks[: config.max_marks]
        lines.append(f"Interactive elements ({len(obs.marks)}):")
        lines += [_mark_line(m) for m in shown] or ["(none on screen)"]
        if len(obs.marks) > len(shown):
            lines.append(f"... and {len(obs.marks) - len(shown)} more (scroll or zoom in)")
    if config.axtree and obs.axtree:
        lines += ["Accessibility tree:", obs.axtree]
    return "\n".join(lines)


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:120] or "task"


@attrs.define
class _Episode:
    """The mutable state of one running episode."""

    config: HarnessConfig
    writer: ArtifactWriter
    images: dict[str, bytes] = attrs.field(factory=dict)
    """Bytes of the screenshots still shown to the model, by artifact URL."""
    messages: list[dict[str, Any]] = attrs.field(factory=list)
    steps: list[TrajectoryStep] = attrs.field(factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    calls: int = 0

    def record_observation(
        self, obs: Observation, action: Action | None, error: str | None, message_index: int | None
    ) -> dict[str, Any]:
        """Store the step and return the image part that shows it to the model."""
        index = len(self.steps)
        artifacts = {"screenshot": self.writer.write(f"step-{index:03d}.png", obs.screenshot)}
        shown = artifacts["screenshot"]
        if obs.screenshot_som is not None and self.config.som_overlay:
            shown = artifacts["screenshot_som"] = self.writer.write(
                f"step-{index:03d}-som.png", obs.screenshot_som
            )
        self.steps.append(
            TrajectoryStep(
                index=index,
                action=None if action is None else action.to_dict(),
                observation={"url": obs.url, "title": obs.title, "tabs": len(obs.tabs)},
                artifacts=artifacts,
                message_index=message_index,
                error=error,
            )
        )
        url = artifact_url(shown)
        som = "screenshot_som" in artifacts and obs.screenshot_som is not None
        self.images[url] = obs.screenshot_som if som and obs.screenshot_som else obs.screenshot
        return {"type": "image_url", "image_url": {"url": url}}

    def context(self) -> list[dict[str, Any]]:
        """The messages as sent: the last k screenshots inlined, older ones a placeholder."""
        urls = [
            part["image_url"]["url"]
            for m in self.messages
            if isinstance(m.get("content"), list)
            for part in m["content"]
            if part.get("type") == "image_url"
        ]
        keep = set(urls[-self.config.history_screenshots :])
        for url in list(self.images):
            if url not in keep:
                del self.images[url]
        out = []
        for message in self.messages:
            content = message.get("content")
            if isinstance(content, list):
                parts = []
                old = any(
                    (p.get("image_url") or {}).get("url") not in keep
                    for p in content
                    if p.get("type") == "image_url"
                )
                for part in content:
                    shown = (part.get("image_url") or {}).get("url")
                    if shown is None:
                        parts.append(_brief(part) if old else part)
                    elif shown in keep:
                        inline = {"url": _data_url(self.images[shown])}
                        parts.append({"type": "image_url", "image_url": inline})
                    else:
                        parts.append({"type": "text", "text": _OMITTED})
                message = {**message, "content": parts}
            out.append(message)
        return out


def _brief(part: dict[str, Any]) -> dict[str, Any]:
    """An old observation's text without its element list and accessibility tree."""
    text = str(part.get("text") or "")
    for marker in _OLD_DETAIL_MARKERS:
        text = text.split(marker, 1)[0]
    return {**part, "text": text}


def _data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _observation_message(text: str, image: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}, image]}


def _reply_action(
    result: ChatResult, config: HarnessConfig
) -> tuple[Action | None, str | None, list[dict[str, Any]]]:
    """The action in a reply, the error to show instead, and the tool answers to append."""
    message = result.message
    if config.action_format == "text":
        try:
            return parse_text_action(str(message.get("content") or "")), None, []
        except ActionError as exc:
            return None, str(exc), []
    calls = message.get("tool_calls") or []
    if not calls:
        return None, "no tool call: call exactly one of the tools (one action per turn)", []
    answers: list[dict[str, Any]] = []
    action: Action | None = None
    error: str | None = None
    for i, call in enumerate(calls):
        function = call.get("function") or {}
        call_id = str(call.get("id") or f"call_{i}")
        call["id"] = call_id  # the stored reply must name what the tool messages answer
        if i > 0:
            answers.append(
                {"role": "tool", "tool_call_id": call_id, "content": "ignored: one action per turn"}
            )
            continue
        try:
            action = action_from_tool_call(str(function.get("name")), function.get("arguments"))
        except ActionError as exc:
            error = str(exc)
        answers.insert(0, {"role": "tool", "tool_call_id": call_id, "content": error or "ok"})
    return action, error, answers


async def run_episode(
    sandbox: AsyncSandbox,
    browser: BrowserSession,
    task: WebTask,
    model: ModelConfig,
    run_dir: str | Path,
    *,
    config: HarnessConfig | None = None,
    attempt: int = 0,
    chat_factory: Callable[[ModelConfig, Mapping[str, str]], ChatClient] | None = None,
) -> Trajectory:
    """Run one episode of ``task`` in ``sandbox`` with ``browser`` (see the module doc).

    Never raises for what happens inside the episode: a model, browser or task failure
    ends it with ``exit_status`` ``error: ...`` and the trajectory so far.
    """
    config = config or HarnessConfig()
    headers = {INSTANCE_ID_HEADER: task.task_id}
    make_chat = chat_factory or (lambda m, h: ChatClient(m, headers=h))
    episode_dir = f"artifacts/{_safe_name(task.task_id)}/{attempt}-{uuid.uuid4().hex[:8]}"
    writer = ArtifactWriter(run_dir, episode_dir)
    state = _Episode(config=config, writer=writer)
    started_at, t0 = time.time(), time.monotonic()
    exit_status, answer, error = "", "", None
    reward: float | None = None
    started = False
    instruction = task.instruction
    tools = action_tools() if config.action_format == "tools" else []
    episode = episode_for(task)
    try:
        async with asyncio.timeout(config.max_time_s), make_chat(model, headers) as chat:
            instruction, obs = await episode.start(
                sandbox, browser, marks=config.marks, axtree=config.axtree
            )
            started = True
            state.messages.append(
                {"role": "system", "content": system_prompt(config, obs.viewport)}
            )
            image = state.record_observation(obs, None, None, None)
            state.messages.append(
                _observation_message(
                    f"Task: {instruction}\n\n{observation_text(obs, config)}", image
                )
            )
            format_errors = 0
            while True:
                if state.calls >= config.max_steps:
                    exit_status = STEP_LIMIT
                    break
                result = await chat.complete(state.context(), tools or None)
                state.calls += 1
                state.prompt_tokens += result.prompt_tokens
                state.completion_tokens += result.completion_tokens
                state.cost += result.cost
                state.messages.append(result.message)
                chosen_by = len(state.messages) - 1
                action, problem, tool_answers = _reply_action(result, config)
                state.messages += tool_answers
                if action is None:
                    format_errors += 1
                    if format_errors >= config.max_format_errors:
                        exit_status = FORMAT_ERROR
                        break
                    state.messages.append(
                        {"role": "user", "content": f"Your reply had no usable action: {problem}"}
                    )
                    continue
                format_errors = 0
                if action.kind == "done":
                    answer = action.answer or ""
                    state.steps.append(
                        TrajectoryStep(
                            index=len(state.steps), action=action.to_dict(), message_index=chosen_by
                        )
                    )
                    exit_status = SUBMITTED
                    break
                acted = time.monotonic()
                step = await browser.step(
                    action, marks=config.marks, axtree=config.axtree, som=config.som_overlay
                )
                obs = step.observation
                image = state.record_observation(obs, action, step.error, chosen_by)
                state.steps[-1].extra["latency_s"] = round(time.monotonic() - acted, 4)
                outcome = f"Action failed: {step.error}" if step.error else f"Done: {action}"
                state.messages.append(
                    _observation_message(f"{outcome}\n\n{observation_text(obs, config)}", image)
                )
    except TimeoutError:
        exit_status = TIME_LIMIT
    except Exception as exc:
        exit_status, error = error_status(exc), f"{type(exc).__name__}: {exc}"
    if started and not exit_status.startswith("error"):
        try:  # outside the episode's time limit: a submitted answer is always graded
            reward = await asyncio.wait_for(
                episode.reward(sandbox, browser, answer if exit_status == SUBMITTED else None),
                REWARD_TIMEOUT_S,
            )
        except Exception as exc:
            error = f"grading: {type(exc).__name__}: {exc}"
            exit_status = error_status(error)
    finished_at = time.time()
    verdict = None if reward is None else ("success" if reward > 0 else "failure")
    metadata = TrajectoryMetadata(
        task_id=task.task_id,
        recipe="gui",
        harness=HARNESS_NAME,
        model=model.model,
        attempt=attempt,
        exit_status=exit_status,
        steps=state.calls,
        prompt_tokens=state.prompt_tokens,
        completion_tokens=state.completion_tokens,
        cost=state.cost,
        started_at=started_at,
        finished_at=finished_at,
        duration_s=time.monotonic() - t0,
        final_output=answer,
        reward=reward,
        verdict=verdict,
        error=error,
        extra={
            "instruction": instruction,
            "task": task.to_dict(),
            "harness_config": attrs.asdict(config),
            "grading": dict(episode.info),
        },
    )
    return Trajectory(metadata=metadata, messages=state.messages, tools=tools, steps=state.steps)

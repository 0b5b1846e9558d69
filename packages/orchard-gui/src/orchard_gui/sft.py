"""Per-step SFT examples from GUI trajectories.

Each action step ``i >= 1`` of a trajectory becomes one single-turn example::

    system     the harness's system prompt
    user       "Task: ...", the previous actions as numbered text lines, the page text the
               model saw before the action (URL, title, numbered marks) and the screenshot
               BEFORE the action (step ``i - 1``'s artifact) as an image part
    assistant  the action: the model's own tool call (``tools`` format, with its thought as
               content) or ``Action: click(412, 88)`` text (``text`` format)

Written as JSON lines ``{"messages", "tools"?, "meta": {task_id, step, attempt, reward,
verdict, model}}``; ``tools`` (the action tool specs) only in the tools format. Images
are ``data:`` URLs (``inline_images=True``) or ``artifact:`` references, in which case
``meta["artifact_root"]`` names the directory they are relative to (resolve them with
:func:`orchard_env_client.trajectory.inline_artifacts`).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import attrs

from orchard_env_client.trajectory import (
    Trajectory,
    TrajectoryStep,
    artifact_path,
    artifact_url,
    inline_artifacts,
    iter_jsonl,
)

from .actions import Action, ActionError, action_tools
from .text_actions import format_action
from .trajectory_view import action_history, instruction_of

__all__ = ["SFTConfig", "SFTSummary", "step_examples", "write_sft", "write_sft_file"]

ActionFormat = Literal["auto", "tools", "text"]


@attrs.define(frozen=True, kw_only=True)
class SFTConfig:
    """What goes into the examples."""

    min_reward: float | None = None
    """Keep only trajectories with ``reward >= min_reward`` (None: keep all, ungraded too)."""
    history: int = attrs.field(default=10, validator=attrs.validators.ge(0))
    """How many previous actions are listed in the user message."""
    inline_images: bool = True
    """Images as ``data:`` URLs; False keeps ``artifact:`` references."""
    action_format: ActionFormat = attrs.field(
        default="auto", validator=attrs.validators.in_(("auto", "tools", "text"))
    )
    """``auto``: the format the trajectory was recorded in (tools when it has tool specs)."""
    marks: bool = True
    """Keep the numbered interactive elements in the page text."""
    som: bool = False
    """Use the Set-of-Mark screenshot (numbered boxes) where one was recorded."""
    keep_thoughts: bool = True
    """Keep the model's text before its action (its thought) in the assistant message."""
    skip_failed_actions: bool = True
    """Leave out steps whose action failed in the browser."""
    system_prompt: str | None = None
    """Replaces the system prompt (default: the trajectory's own when the format is the one
    it was recorded in, else the packaged harness prompt of the target format)."""
    viewport: tuple[int, int] = (1280, 720)
    """Filled into the packaged prompt when the trajectory's own cannot be used."""


@attrs.define(kw_only=True)
class SFTSummary:
    """What :func:`write_sft` wrote and left out."""

    out_path: Path
    trajectories: int = 0
    used: int = 0
    """Trajectories that passed the reward filter."""
    examples: int = 0
    skipped: dict[str, int] = attrs.field(factory=dict)
    """Steps or trajectories left out, counted by reason."""


def _recorded_format(traj: Trajectory) -> str:
    if traj.tools:
        return "tools"
    config = traj.metadata.extra.get("harness_config")
    if isinstance(config, dict) and config.get("action_format") in ("tools", "text"):
        return str(config["action_format"])
    return "text"


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("text")
        )
    return ""


def _page_text(traj: Trajectory, before: TrajectoryStep, marks: bool) -> str:
    """The page text the model saw with ``before``'s screenshot (URL, title, marks...)."""
    urls = {artifact_url(a) for a in before.artifacts.values()}
    text = ""
    for message in traj.messages:
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        shown = {(p.get("image_url") or {}).get("url") for p in content if isinstance(p, dict)}
        if shown & urls:
            text = _message_text(message)
            break
    start = text.find("URL:")
    if start < 0:
        obs = before.observation
        text = f"URL: {obs.get('url', '')}\nTitle: {obs.get('title', '')}"
    else:
        text = text[start:]
    if not marks:
        text = text.split("\nInteractive elements", 1)[0]
    return text.strip()


def _without_action_lines(text: str) -> str:
    return "\n".join(
        line for line in text.splitlines() if not line.strip().lower().startswith("action:")
    ).strip()


def _assistant(
    traj: Trajectory, step: TrajectoryStep, action: Action, target: str, config: SFTConfig
) -> dict[str, Any]:
    original: dict[str, Any] = {}
    if step.message_index is not None and 0 <= step.message_index < len(traj.messages):
        candidate = traj.messages[step.message_index]
        if candidate.get("role") == "assistant":
            original = candidate
    recorded = _recorded_format(traj)
    said = _message_text(original).strip()
    if target == "text":
        if recorded == "text" and said and config.keep_thoughts:
            return {"role": "assistant", "content": said}
        thought = _without_action_lines(said) if config.keep_thoughts else ""
        line = f"Action: {format_action(action)}"
        return {"role": "assistant", "content": f"{thought}\n{line}" if thought else line}
    arguments = {k: v for k, v in action.to_dict().items() if k != "action"}
    thought = _without_action_lines(said) if config.keep_thoughts else ""
    return {
        "role": "assistant",
        "content": thought or None,
        "tool_calls": [
            {
                "id": f"call_{step.index}",
                "type": "function",
                "function": {"name": action.kind, "arguments": json.dumps(arguments)},
            }
        ],
    }


def _system(traj: Trajectory, target: str, config: SFTConfig) -> str:
    if config.system_prompt is not None:
        return config.system_prompt
    if target == _recorded_format(traj):
        for message in traj.messages:
            if message.get("role") == "system":
                return _message_text(message)
    from .harness import HarnessConfig, system_prompt

    fmt: Literal["tools", "text"] = "tools" if target == "tools" else "text"
    return system_prompt(HarnessConfig(action_format=fmt), config.viewport)


def step_examples(
    traj: Trajectory,
    jsonl_dir: str | os.PathLike[str],
    config: SFTConfig | None = None,
    skipped: Counter[str] | None = None,
) -> list[dict[str, Any]]:
    """The SFT examples of one trajectory (none when it fails the reward filter).

    Steps left out are counted by reason in ``skipped`` when given: ``reward filter``,
    ``failed action``, ``invalid action``, ``no screenshot before``, ``missing screenshot
    file``.
    """
    config = config or SFTConfig()
    skipped = skipped if skipped is not None else Counter()
    reward = traj.metadata.reward
    if config.min_reward is not None and (reward is None or reward < config.min_reward):
        skipped["reward filter (trajectories)"] += 1
        return []
    target = _recorded_format(traj) if config.action_format == "auto" else config.action_format
    system = _system(traj, target, config)
    tools = (traj.tools or action_tools()) if target == "tools" else None
    by_index = {s.index: s for s in traj.steps}
    instruction = instruction_of(traj)
    root = Path(jsonl_dir)
    examples = []
    for step in traj.steps:
        if step.action is None or step.index < 1:
            continue
        if step.error and config.skip_failed_actions:
            skipped["failed action"] += 1
            continue
        try:
            action = Action.from_dict(step.action)
        except ActionError:
            skipped["invalid action"] += 1
            continue
        before = by_index.get(step.index - 1)
        artifact = None
        if before is not None:
            artifact = (config.som and before.artifacts.get("screenshot_som")) or (
                before.artifacts.get("screenshot")
            )
        if before is None or artifact is None:
            skipped["no screenshot before"] += 1
            continue
        if not artifact_path(root, artifact).is_file():
            skipped["missing screenshot file"] += 1
            continue
        text = (
            f"Task: {instruction}\n\nPrevious actions:\n"
            f"{action_history(traj, upto=step.index, last=config.history)}\n\n"
            f"{_page_text(traj, before, config.marks)}"
        )
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": text},
                    {"type": "image_url", "image_url": {"url": artifact_url(artifact)}},
                ],
            },
            _assistant(traj, step, action, target, config),
        ]
        meta: dict[str, Any] = {
            "task_id": traj.metadata.task_id,
            "step": step.index,
            "attempt": traj.metadata.attempt,
            "reward": reward,
            "verdict": traj.metadata.verdict,
            "model": traj.metadata.model,
        }
        if config.inline_images:
            messages = inline_artifacts(messages, root)
        else:
            meta["artifact_root"] = str(root.resolve())
        example: dict[str, Any] = {"messages": messages}
        if tools is not None:
            example["tools"] = tools
        example["meta"] = meta
        examples.append(example)
    return examples


def write_sft(
    jsonl_paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    out_path: str | os.PathLike[str],
    config: SFTConfig | None = None,
) -> SFTSummary:
    """Convert every trajectory of the run files ``jsonl_paths`` and write the examples to
    ``out_path`` (replaced) as JSON lines; returns the counts."""
    paths = (
        [Path(jsonl_paths)]
        if isinstance(jsonl_paths, str | os.PathLike)
        else [Path(p) for p in jsonl_paths]
    )
    out = Path(out_path)
    if any(p.resolve() == out.resolve() for p in paths):
        raise ValueError(f"out_path {out} is one of the input files")
    summary = SFTSummary(out_path=out)
    skipped: Counter[str] = Counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            for path in paths:
                for traj in iter_jsonl(path):
                    summary.trajectories += 1
                    examples = step_examples(traj, path.parent, config, skipped)
                    for example in examples:
                        fh.write(json.dumps(example, ensure_ascii=False) + "\n")
                    summary.examples += len(examples)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    summary.skipped = dict(skipped)
    summary.used = summary.trajectories - skipped.get("reward filter (trajectories)", 0)
    return summary


def write_sft_file(
    jsonl_paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    out_path: str | os.PathLike[str],
    **options: Any,
) -> SFTSummary:
    """:func:`write_sft` with the :class:`SFTConfig` fields as keyword arguments
    (``min_reward=1.0, history=5, inline_images=False``...)."""
    return write_sft(jsonl_paths, out_path, SFTConfig(**options))

"""Read-only views of a GUI trajectory shared by the judges, SFT conversion and contact sheets.

A GUI trajectory (written by :mod:`orchard_gui.harness`) has step 0 = the first observation
(no action) and step i >= 1 = the i-th action with the observation after it; a step's
screenshot is its ``"screenshot"`` artifact, a file beside the run's JSONL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from orchard_env_client.trajectory import Trajectory, TrajectoryStep, artifact_path

from .actions import Action, ActionError
from .text_actions import format_action

__all__ = [
    "ScreenshotRef",
    "action_history",
    "action_text",
    "instruction_of",
    "screenshots",
]


def instruction_of(traj: Trajectory) -> str:
    """The task instruction the agent was given (the task id when none is recorded)."""
    extra = traj.metadata.extra
    instruction = extra.get("instruction")
    if isinstance(instruction, str) and instruction.strip():
        return instruction
    task = extra.get("task")
    if isinstance(task, dict) and isinstance(task.get("instruction"), str):
        return str(task["instruction"])
    for message in traj.messages:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        texts = (
            [content]
            if isinstance(content, str)
            else [p.get("text", "") for p in content or [] if isinstance(p, dict)]
        )
        for text in texts:
            if isinstance(text, str) and text.startswith("Task:"):
                return text.removeprefix("Task:").split("\n\n", 1)[0].strip()
        break
    return traj.metadata.task_id


def action_text(action: dict[str, Any] | None) -> str:
    """An action in the harness's text form (``click(412, 88)``); raw JSON if it does not
    validate (an old or foreign trajectory)."""
    if action is None:
        return "(start)"
    try:
        return format_action(Action.from_dict(action))
    except (ActionError, KeyError, TypeError):
        return json.dumps(action, ensure_ascii=False, sort_keys=True)


def _step_line(step: TrajectoryStep) -> str:
    line = f"{step.index}. {action_text(step.action)}"
    url = step.observation.get("url")
    if url:
        line += f" -> {url}"
    if step.error:
        line += f" [failed: {' '.join(step.error.split())[:200]}]"
    return line


def action_history(traj: Trajectory, *, upto: int | None = None, last: int | None = None) -> str:
    """The actions taken, one numbered line each (with the URL after it and any error).

    ``upto`` keeps the steps with index < ``upto``; ``last`` keeps only the most recent
    ``last`` of those (0: none). Returns ``"(no actions)"`` when nothing is left.
    """
    steps = [s for s in traj.steps if s.action is not None]
    if upto is not None:
        steps = [s for s in steps if s.index < upto]
    if last is not None:
        steps = steps[len(steps) - last :] if last > 0 else []
    return "\n".join(_step_line(s) for s in steps) or "(no actions)"


@attrs.define(frozen=True)
class ScreenshotRef:
    """One step's screenshot on disk (``exists`` False when the file is missing)."""

    step: int
    path: Path
    action: dict[str, Any] | None
    exists: bool


def screenshots(
    traj: Trajectory, jsonl_dir: str | Path, name: str = "screenshot"
) -> list[ScreenshotRef]:
    """The steps that recorded artifact ``name``, in step order, with their file paths."""
    out = []
    for step in traj.steps:
        artifact = step.artifacts.get(name)
        if artifact is None:
            continue
        path = artifact_path(jsonl_dir, artifact)
        out.append(ScreenshotRef(step.index, path, step.action, path.is_file()))
    return out

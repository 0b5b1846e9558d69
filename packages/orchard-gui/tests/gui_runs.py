"""Synthetic GUI runs on disk for the judge, SFT and contact-sheet tests.

A run is laid out as the harness writes it: ``<dir>/trajectories.jsonl`` plus
``<dir>/artifacts/<task>/<attempt>/step-NNN.png`` (real PNGs drawn with Pillow), step 0 the
first observation, one step per action with the observation after it, and a final ``done``
step without a screenshot; the messages hold the screenshots as ``artifact:`` references.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from orchard_env_client.trajectory import (
    ArtifactWriter,
    Trajectory,
    TrajectoryMetadata,
    TrajectoryStep,
    append_jsonl,
    artifact_url,
)
from orchard_gui.actions import Action
from orchard_gui.text_actions import format_action

VIEWPORT = (640, 360)
DEFAULT_ACTIONS: list[dict[str, Any]] = [
    {"action": "click", "x": 100, "y": 50},
    {"action": "type", "text": "blue shoes", "submit": True},
    {"action": "scroll", "direction": "down"},
    {"action": "click", "x": 300, "y": 200},
]


def png(label: str, colour: tuple[int, int, int], size: tuple[int, int] = VIEWPORT) -> bytes:
    """A real PNG: a coloured page with ``label`` written on it."""
    image = Image.new("RGB", size, colour)
    ImageDraw.Draw(image).text((20, 20), label, fill=(0, 0, 0))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def marks_text(index: int) -> str:
    return f'Interactive elements (2):\n[1] button "Search {index}" at (100, 50)\n[2] link "Home" at (20, 10)'


def make_trajectory(
    run_dir: Path,
    *,
    task_id: str = "shop-1",
    instruction: str = "Find blue shoes under $50 and report the cheapest price.",
    actions: list[dict[str, Any]] | None = None,
    fmt: str = "tools",
    errors: dict[int, str] | None = None,
    reward: float | None = None,
    answer: str | None = "$42",
    attempt: int = 0,
    started_at: float = 1000.0,
) -> Trajectory:
    """A trajectory whose screenshots are written under ``run_dir`` (not appended to a file)."""
    actions = DEFAULT_ACTIONS if actions is None else actions
    errors = errors or {}
    writer = ArtifactWriter(run_dir, f"artifacts/{task_id}/{attempt}")
    tools = (
        [{"type": "function", "function": {"name": "click", "parameters": {}}}]
        if fmt == "tools"
        else []
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are a web agent ({fmt} format)."}
    ]
    steps: list[TrajectoryStep] = []

    def observe(index: int, action: dict[str, Any] | None, message_index: int | None) -> dict:
        shot = writer.write(
            f"step-{index:03d}.png", png(f"step {index}", (40 * index % 256, 200, 120))
        )
        url = f"http://127.0.0.1:8000/page{index}"
        steps.append(
            TrajectoryStep(
                index=index,
                action=action,
                observation={"url": url, "title": f"Page {index}", "tabs": 1},
                artifacts={"screenshot": shot},
                message_index=message_index,
                error=errors.get(index),
            )
        )
        text = f"URL: {url}\nTitle: Page {index}\n{marks_text(index)}"
        return {"image_url": {"url": artifact_url(shot)}, "type": "image_url", "text_": text}

    first = observe(0, None, None)
    messages.append(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": f"Task: {instruction}\n\n{first.pop('text_')}"},
                first,
            ],
        }
    )
    all_actions = (
        [*actions, {"action": "done", "answer": answer}] if answer is not None else actions
    )
    for i, action in enumerate(all_actions, 1):
        act = Action.from_dict(action)
        thought = f"Thought {i}: doing {act.kind}."
        if fmt == "tools":
            args = {k: v for k, v in act.to_dict().items() if k != "action"}
            messages.append(
                {
                    "role": "assistant",
                    "content": thought,
                    "tool_calls": [
                        {
                            "id": f"c{i}",
                            "type": "function",
                            "function": {"name": act.kind, "arguments": json.dumps(args)},
                        }
                    ],
                }
            )
            chosen = len(messages) - 1
            messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "ok"})
        else:
            messages.append(
                {"role": "assistant", "content": f"{thought}\nAction: {format_action(act)}"}
            )
            chosen = len(messages) - 1
        if act.kind == "done":
            steps.append(TrajectoryStep(index=i, action=act.to_dict(), message_index=chosen))
            break
        image = observe(i, act.to_dict(), chosen)
        outcome = f"Action failed: {errors[i]}" if i in errors else f"Done: {act}"
        messages.append(
            {
                "role": "user",
                "content": [{"type": "text", "text": f"{outcome}\n\n{image.pop('text_')}"}, image],
            }
        )
    metadata = TrajectoryMetadata(
        task_id=task_id,
        recipe="gui",
        harness="react",
        model="agent-model",
        attempt=attempt,
        exit_status="submitted" if answer is not None else "step_limit",
        steps=len(all_actions),
        started_at=started_at,
        final_output=answer or "",
        reward=reward,
        verdict=None if reward is None else ("success" if reward > 0 else "failure"),
        extra={"instruction": instruction, "harness_config": {"action_format": fmt}},
    )
    return Trajectory(metadata=metadata, messages=messages, tools=tools, steps=steps)


def make_run(run_dir: Path, trajectories: list[dict[str, Any]] | None = None) -> Path:
    """Write a run file of trajectories (``make_trajectory`` keyword sets) and return it."""
    path = run_dir / "trajectories.jsonl"
    for spec in trajectories or [{}]:
        append_jsonl(path, make_trajectory(run_dir, **spec))
    return path

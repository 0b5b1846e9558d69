"""Model judges of GUI trajectories: WebJudge (three stages) and a single-call judge.

WebJudge follows the method of Online-Mind2Web's judge (Xue et al., 2025, "An Illusion of
Progress? Assessing the Current State of Web Agents"), with this package's own prompts:

1. *key points*: from the task alone, the requirements a successful run must meet;
2. *key screenshots*: each screenshot of the run (the most recent ``max_screenshots``) is
   scored 1-5 for its relevance to the key points, with a reason; those scoring at least
   ``score_threshold`` are kept, at most ``max_key_screenshots`` of them (the highest
   scores, later steps first among equals), shown in step order;
3. *verdict*: from the task, the key points, the action history (text), how the run ended,
   the final answer and the key screenshots (each with its reason), ``success`` or
   ``failure``.

The single-call judge asks for the verdict from the task, the action history, the answer
and the last ``last_k`` screenshots.

A reply without a readable verdict gives verdict ``"unknown"`` and reward ``None`` (not a
failure: the trajectory is not graded, and the reply is kept in ``raw``); an unreadable
screenshot score counts as not relevant; a reply listing no key points falls back to the
task itself as the only key point. These are recorded in ``notes``. A model error
(:class:`orchard_env_client.llm.ModelError`) propagates; :func:`judge_file` records it per
trajectory instead of stopping the batch.
"""

from __future__ import annotations

import asyncio
import base64
import io
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal

import attrs

from orchard_env_client.llm import ChatClient, ChatResult
from orchard_env_client.trajectory import Trajectory

from ..trajectory_view import (
    ScreenshotRef,
    action_history,
    action_text,
    instruction_of,
    screenshots,
)
from .parse import UNKNOWN, parse_key_points, parse_score, parse_verdict

__all__ = [
    "JUDGE_METHODS",
    "JudgeConfig",
    "JudgeResult",
    "judge_trajectory",
    "load_prompt",
    "single_judge",
    "webjudge",
]

JudgeMethod = Literal["webjudge", "single"]
JUDGE_METHODS: Final[tuple[str, ...]] = ("webjudge", "single")


@attrs.define(frozen=True, kw_only=True)
class JudgeConfig:
    """Settings of both judges."""

    score_threshold: int = attrs.field(default=3, validator=attrs.validators.in_(range(1, 6)))
    """WebJudge: the lowest relevance score (1-5) of a key screenshot."""
    max_key_screenshots: int = attrs.field(default=8, validator=attrs.validators.ge(0))
    """WebJudge: most key screenshots shown to the verdict stage."""
    max_screenshots: int = attrs.field(default=50, validator=attrs.validators.ge(1))
    """WebJudge: most screenshots scored (the most recent ones)."""
    last_k: int = attrs.field(default=3, validator=attrs.validators.ge(0))
    """Single-call judge: how many of the last screenshots it sees."""
    concurrency: int = attrs.field(default=4, validator=attrs.validators.ge(1))
    """WebJudge: screenshot scoring calls in flight at once (per trajectory)."""
    image_max_width: int | None = None
    """Downscale screenshots wider than this before sending them (None: as recorded)."""
    max_answer_chars: int = 4000
    """The final answer is cut to this many characters in the prompts."""
    prompts: Mapping[str, str] = attrs.field(factory=dict)
    """Replacements of packaged prompts by file stem (e.g. ``{"verdict_system": "..."}``)."""


@attrs.define(kw_only=True)
class JudgeResult:
    """A judge's decision about one trajectory."""

    method: str
    verdict: str
    """``"success"``, ``"failure"`` or ``"unknown"`` (no readable verdict)."""
    reward: float | None
    """1.0 for success, 0.0 for failure, None for unknown."""
    reasoning: str
    """The verdict reply's text."""
    key_points: list[str] = attrs.field(factory=list)
    key_screenshots: list[int] = attrs.field(factory=list)
    """Step indices of the screenshots the verdict call saw, in step order."""
    scores: dict[int, int | None] = attrs.field(factory=dict)
    """WebJudge: the relevance score of each scored step (None: unreadable reply)."""
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    model: str = ""
    notes: list[str] = attrs.field(factory=list)
    """What did not go to plan (missing screenshot files, unreadable replies...)."""
    raw: list[dict[str, Any]] = attrs.field(factory=list)
    """Every call: ``{"stage", "step"?, "content", "prompt_tokens", "completion_tokens"}``."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``scores`` keyed by step as strings)."""
        out = attrs.asdict(self)
        out["scores"] = {str(k): v for k, v in self.scores.items()}
        return out


def load_prompt(name: str, config: JudgeConfig | None = None) -> str:
    """The prompt ``name`` (a file stem under ``judges/prompts``), or its override."""
    if config is not None and name in config.prompts:
        return config.prompts[name]
    return (
        resources.files("orchard_gui.judges").joinpath("prompts", f"{name}.txt").read_text("utf-8")
    )


def _fill(template: str, **values: str) -> str:
    # Plain replacement: task text may hold braces that str.format would choke on.
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), template).strip()


def _reply_text(result: ChatResult) -> str:
    content = result.message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _image_part(ref: ScreenshotRef, config: JudgeConfig) -> dict[str, Any]:
    data = ref.path.read_bytes()
    if config.image_max_width is not None:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:
            if image.width > config.image_max_width:
                height = max(1, round(image.height * config.image_max_width / image.width))
                small = image.convert("RGB").resize((config.image_max_width, height))
                buffer = io.BytesIO()
                small.save(buffer, format="PNG")
                data = buffer.getvalue()
    url = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    return {"type": "image_url", "image_url": {"url": url}}


@attrs.define
class _Tally:
    """Usage and replies of one judgment."""

    model: str
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    notes: list[str] = attrs.field(factory=list)
    raw: list[dict[str, Any]] = attrs.field(factory=list)

    async def ask(
        self,
        client: ChatClient,
        system: str,
        user: str | list[dict[str, Any]],
        stage: str,
        step: int | None = None,
    ) -> str:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]
        result = await client.complete(messages)
        text = _reply_text(result)
        self.calls += 1
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += result.completion_tokens
        self.cost += result.cost
        self.model = result.model or self.model
        record: dict[str, Any] = {"stage": stage}
        if step is not None:
            record["step"] = step
        record |= {
            "content": text,
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
        }
        self.raw.append(record)
        return text

    def result(self, method: str, reasoning: str, **fields: Any) -> JudgeResult:
        verdict = parse_verdict(reasoning)
        if verdict == UNKNOWN:
            self.notes.append("the verdict reply states neither success nor failure")
        reward = {"success": 1.0, "failure": 0.0}.get(verdict)
        return JudgeResult(
            method=method,
            verdict=verdict,
            reward=reward,
            reasoning=reasoning,
            calls=self.calls,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cost=self.cost,
            model=self.model,
            notes=self.notes,
            raw=self.raw,
            **fields,
        )


def _existing(refs: Sequence[ScreenshotRef], tally: _Tally) -> list[ScreenshotRef]:
    missing = [r for r in refs if not r.exists]
    if missing:
        tally.notes.append(
            "missing screenshot files (skipped): "
            + ", ".join(f"step {r.step}: {r.path}" for r in missing)
        )
    return [r for r in refs if r.exists]


def _answer(traj: Trajectory, config: JudgeConfig) -> str:
    answer = traj.metadata.final_output
    if not answer:
        return "(none given)"
    if len(answer) > config.max_answer_chars:
        return answer[: config.max_answer_chars] + " [...cut]"
    return answer


def _exit_status(traj: Trajectory) -> str:
    status = traj.metadata.exit_status or "unknown"
    if status == "submitted":
        return "the agent declared the task done"
    return f"the agent did not declare the task done ({status})"


def _reason(text: str) -> str:
    """The ``Reasoning:`` part of a screenshot reply (the whole reply without a label)."""
    plain = text.replace("**", "")
    match = re.search(r"reasoning\s*:\s*(.*?)(?:\n\s*score\b.*)?$", plain, re.I | re.S)
    body = match.group(1) if match else re.sub(r"(?is)\n?\s*score\b.*$", "", plain)
    return " ".join(body.split())[:600]


async def webjudge(
    traj: Trajectory, jsonl_dir: str | Path, client: ChatClient, config: JudgeConfig | None = None
) -> JudgeResult:
    """Judge ``traj`` with the three WebJudge stages (see the module doc)."""
    config = config or JudgeConfig()
    tally = _Tally(model=client.config.model)
    task = instruction_of(traj)

    reply = await tally.ask(
        client,
        load_prompt("key_points_system", config),
        _fill(load_prompt("key_points_user", config), task=task),
        "key_points",
    )
    key_points = parse_key_points(reply)
    if not key_points:
        tally.notes.append("the key-point reply listed none; using the task as the key point")
        key_points = [task]
    points_text = "\n".join(f"{i}. {p}" for i, p in enumerate(key_points, 1))

    refs = _existing(screenshots(traj, jsonl_dir), tally)[-config.max_screenshots :]
    limit = asyncio.Semaphore(config.concurrency)
    system = load_prompt("screenshot_system", config)
    template = load_prompt("screenshot_user", config)

    async def score(ref: ScreenshotRef) -> tuple[int | None, str]:
        text = _fill(
            template,
            task=task,
            key_points=points_text,
            step=str(ref.step),
            action="the first page" if ref.action is None else action_text(ref.action),
        )
        async with limit:
            content = [{"type": "text", "text": text}, _image_part(ref, config)]
            reply = await tally.ask(client, system, content, "screenshot", ref.step)
        return parse_score(reply), _reason(reply)

    scored = await asyncio.gather(*(score(r) for r in refs))
    scores = {ref.step: s for ref, (s, _) in zip(refs, scored, strict=True)}
    unreadable = [step for step, s in scores.items() if s is None]
    if unreadable:
        tally.notes.append(f"unreadable screenshot scores (counted as not relevant): {unreadable}")
    candidates = [
        (s, ref, reason)
        for ref, (s, reason) in zip(refs, scored, strict=True)
        if s is not None and s >= config.score_threshold
    ]
    candidates.sort(key=lambda c: (c[0], c[1].step), reverse=True)
    chosen = sorted(candidates[: config.max_key_screenshots], key=lambda c: c[1].step)
    if not chosen:
        tally.notes.append("no screenshot reached the relevance threshold")

    content: list[dict[str, Any]] = [
        {
            "type": "text",
            "text": _fill(
                load_prompt("verdict_user", config),
                task=task,
                key_points=points_text,
                actions=action_history(traj),
                exit_status=_exit_status(traj),
                answer=_answer(traj, config),
            ),
        }
    ]
    for s, ref, reason in chosen:
        caption = f"Screenshot after step {ref.step} (relevance {s}/5): {reason}"
        content += [{"type": "text", "text": caption}, _image_part(ref, config)]
    if not chosen:
        content.append({"type": "text", "text": "(no screenshot was found relevant)"})
    reasoning = await tally.ask(client, load_prompt("verdict_system", config), content, "verdict")
    return tally.result(
        "webjudge",
        reasoning,
        key_points=key_points,
        key_screenshots=[ref.step for _, ref, _ in chosen],
        scores=scores,
    )


async def single_judge(
    traj: Trajectory, jsonl_dir: str | Path, client: ChatClient, config: JudgeConfig | None = None
) -> JudgeResult:
    """Judge ``traj`` in one call: task, actions, answer and the last ``last_k`` screenshots."""
    config = config or JudgeConfig()
    tally = _Tally(model=client.config.model)
    refs = _existing(screenshots(traj, jsonl_dir), tally)
    refs = refs[len(refs) - config.last_k :] if config.last_k > 0 else []
    content: list[dict[str, Any]] = [
        {
            "type": "text",
            "text": _fill(
                load_prompt("single_user", config),
                task=instruction_of(traj),
                actions=action_history(traj),
                exit_status=_exit_status(traj),
                answer=_answer(traj, config),
            ),
        }
    ]
    for ref in refs:
        content += [
            {"type": "text", "text": f"Screenshot after step {ref.step}:"},
            _image_part(ref, config),
        ]
    reasoning = await tally.ask(client, load_prompt("single_system", config), content, "verdict")
    return tally.result("single", reasoning, key_screenshots=[r.step for r in refs])


async def judge_trajectory(
    traj: Trajectory,
    jsonl_dir: str | Path,
    client: ChatClient,
    *,
    method: JudgeMethod = "webjudge",
    config: JudgeConfig | None = None,
) -> JudgeResult:
    """Judge one trajectory whose screenshots live under ``jsonl_dir`` (the directory of its
    JSONL file) with ``method`` (``"webjudge"`` or ``"single"``)."""
    if method == "webjudge":
        return await webjudge(traj, jsonl_dir, client, config)
    if method == "single":
        return await single_judge(traj, jsonl_dir, client, config)
    raise ValueError(f"unknown judge method {method!r}; use one of {list(JUDGE_METHODS)}")

"""The learned value model: prefixes rendered with the chat template, BCE training on final
outcomes, and the credit-assignment Estimator that serves it from one long-lived worker.

Real end to end on the proof's data (two built-in tasks through real sandboxes: gold
resolved, half-fix unresolved) with the random tiny Llama in the training venv.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest

from orchard_swe.algorithms.credit import CreditConfig, assistant_positions, credit_samples
from orchard_swe.cli import main as cli_main
from orchard_swe.data.sft_data import ChatRenderer
from orchard_swe.data.tokenizer import load_tokenizer
from orchard_swe.trainers.value_model import (
    ValueModelEstimator,
    prefix_sequence,
)
from orchard_swe.trajectory import Trajectory, TrajectoryMetadata, read_trajectories

BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(load_tokenizer("smollm2"))


def _prefix_texts(traj: Trajectory, renderer: ChatRenderer) -> list[str]:
    """What the policy sees before each turn (and after the last): the prepared messages up
    to each assistant turn, rendered with the generation prompt."""
    messages = [*traj.messages, {"role": "assistant", "content": ""}]
    prepared, tools, inserted = renderer.prepare(messages, traj.tools)
    return [
        renderer.render(prepared[: i + inserted], tools, generation_prompt=True)
        for i in assistant_positions(messages)
    ]


@pytest.mark.integration
def test_each_prefix_ends_where_its_render_ends(renderer: ChatRenderer) -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "ls"}'},
    }
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Fix add()."},
        {"role": "assistant", "content": "Looking.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "calc.py\n"},
        {"role": "assistant", "content": " starts with a space"},
        {"role": "user", "content": "and?"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "done"},
    ]
    meta = TrajectoryMetadata(task_id="i", harness="tools", model="m", verdict="unresolved")
    traj = Trajectory(metadata=meta, messages=messages, tools=[BASH])
    seq = prefix_sequence(traj, renderer)
    assert len(seq.positions) == 3 + 1  # T + 1 values, as credit.py defines them
    assert seq.positions == sorted(seq.positions) and seq.positions[-1] == len(seq.input_ids) - 1
    texts = _prefix_texts(traj, renderer)
    for end, text in zip(seq.positions, texts, strict=True):
        assert renderer.decode(seq.input_ids[: end + 1]) == text
        assert text.endswith("<|im_start|>assistant\n")
    no_turns = Trajectory(metadata=meta, messages=messages[:1])
    assert len(prefix_sequence(no_turns, renderer).positions) == 1


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_train_then_estimate(
    train_venv: Path,
    proof_dir: Path,
    tmp_path: Path,
    renderer: ChatRenderer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model_dir = tmp_path / "value"
    args = [
        "train-value",
        "--trajectories",
        str(proof_dir / "trajectories.jsonl"),
        "--out",
        str(model_dir),
        "--base",
        "random-tiny",
        "--steps",
        "3",
    ]
    rc = await asyncio.to_thread(cli_main, args)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = json.loads(captured.out)
    report = json.loads((model_dir / "report.json").read_text())
    assert summary["loss_after"] == report["loss_after"]
    assert report["model"] == "random-tiny" and report["examples"] == 4
    assert report["prefixes"] == 4 + 4 + 3 + 3  # gold: 3 turns, half: 2 turns
    assert len(report["losses"]) == 3 and all(math.isfinite(x) for x in report["losses"])
    assert report["loss_before"] == pytest.approx(math.log(2), rel=1e-6)  # head starts at 0
    assert report["loss_after"] < report["loss_before"]
    assert {"value_model.json", "value_head.pt", "backbone", "examples.jsonl"} <= {
        p.name for p in model_dir.iterdir()
    }

    trajectories = read_trajectories(proof_dir / "trajectories.jsonl")
    estimator = ValueModelEstimator(model_dir, batch_size=2)
    try:
        together = await asyncio.gather(*(estimator.values(t) for t in trajectories))
        one_by_one = [await estimator.values(t) for t in trajectories]
        proc = estimator._proc
        assert proc is not None and proc.returncode is None  # one worker kept across calls
        for traj, values, again in zip(trajectories, together, one_by_one, strict=True):
            assert len(values) == len(assistant_positions(traj.messages)) + 1
            assert all(0.0 <= v <= 1.0 for v in values)
            assert values == pytest.approx(again, abs=1e-5)
        # the values the worker serves are those it trained: the same prefixes, same model
        resolved = [
            v
            for t, vs in zip(trajectories, together, strict=True)
            for v in vs
            if t.metadata.verdict == "resolved"
        ]
        assert sum(resolved) / len(resolved) == pytest.approx(
            report["after"]["mean_value_resolved"], abs=1e-4
        )
        samples = await credit_samples(trajectories, estimator, CreditConfig())
        assert sum(s.kind == "whole" for s in samples) == 2
        assert {s.kind for s in samples} <= {"whole", "segment"}
    finally:
        await estimator.aclose()
    assert proc.returncode == 0

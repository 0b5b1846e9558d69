"""Our ReAct harness end to end: a scripted model acts through the tools in real sandboxes,
the checker grades the final state, the run lands as trajectories and pass@k / pass^k."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchard_claw.harness import HarnessConfig
from orchard_claw.runner import EvalConfig, evaluate, trials_of
from orchard_claw.scripted import DONE_TEXT, reference_responder
from orchard_claw.tasks import ClawTask, builtin_tasks
from orchard_env_client import AsyncSandboxClient
from orchard_env_client.llm import ModelConfig
from orchard_env_client.testing import ChatRequest, ScriptedModelServer
from orchard_env_client.trajectory import read_jsonl
from orchard_testing import RunningServer

pytestmark = pytest.mark.integration


def _one_per_kind() -> list[ClawTask]:
    seen: dict[str, ClawTask] = {}
    for task in builtin_tasks():
        seen.setdefault(task.kind, task)
    return list(seen.values())


TASKS = _one_per_kind()


def _config(tmp: Path, llm: ScriptedModelServer, server: RunningServer, **kw: Any) -> EvalConfig:
    model = ModelConfig(model="scripted", base_url=llm.base_url, max_retries=0)
    return EvalConfig(out_dir=tmp, model=model, image=server.image, **kw)


async def test_reference_policy_solves_every_kind(
    claw_server: RunningServer, tmp_path: Path
) -> None:
    with ScriptedModelServer() as llm:
        llm.set_default(reference_responder(TASKS))
        config = _config(tmp_path, llm, claw_server, trials=2, concurrency=2)
        async with AsyncSandboxClient(claw_server.url) as client:
            summary = await evaluate(client, TASKS, config)
    assert summary["errors"] == 0 and summary["trials"] == 2 * len(TASKS)
    assert summary["summary"]["pass_hat_k"]["value"] == 1.0
    trajectories = read_jsonl(tmp_path / "trajectories.jsonl", strict=True)
    for traj in trajectories:
        meta = traj.metadata
        assert (meta.recipe, meta.harness, meta.reward) == ("claw", "react", 1.0)
        assert meta.exit_status == "submitted" and meta.final_output == DONE_TEXT
        assert meta.steps == 2 and meta.prompt_tokens > 0
        assert traj.steps[0].action is not None and traj.steps[0].action["tool"] == "shell"
        assert traj.steps[0].observation["exit_code"] == 0
        assert [m["role"] for m in traj.messages] == [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
    assert json.loads((tmp_path / "results.json").read_text())["k"] == 2


async def test_a_rerun_skips_finished_trials(claw_server: RunningServer, tmp_path: Path) -> None:
    task = TASKS[0]
    with ScriptedModelServer() as llm:
        llm.set_default(reference_responder([task]))
        config = _config(tmp_path, llm, claw_server, trials=1)
        async with AsyncSandboxClient(claw_server.url) as client:
            await evaluate(client, [task], config)
            calls = len(llm.requests)
            again = await evaluate(client, [task], config)
    assert len(llm.requests) == calls and again["trials"] == 1


async def test_a_flaky_policy_parts_pass_at_k_from_pass_hat_k(
    claw_server: RunningServer, tmp_path: Path
) -> None:
    with ScriptedModelServer() as llm:
        llm.set_default(reference_responder(TASKS, flaky=True, seed=0))
        config = _config(tmp_path, llm, claw_server, trials=2, concurrency=1)
        async with AsyncSandboxClient(claw_server.url) as client:
            summary = await evaluate(client, TASKS, config)
    row = summary["summary"]
    assert row["pass_at_k"]["value"] == 1.0
    assert row["pass_hat_k"]["value"] < 1.0
    trials = trials_of(read_jsonl(tmp_path / "trajectories.jsonl"), "react")
    assert len(trials) == 2 * len(TASKS) and any(not t.passed for t in trials)


def _idle(request: ChatRequest) -> str:
    return "" if request.step < 5 else "I give up."


async def test_limits_and_format_errors_end_an_episode(
    claw_server: RunningServer, tmp_path: Path
) -> None:
    task = TASKS[0]
    with ScriptedModelServer() as llm:
        async with AsyncSandboxClient(claw_server.url) as client:
            llm.set_default(_idle)
            config = _config(
                tmp_path / "idle",
                llm,
                claw_server,
                trials=1,
                harness_config=HarnessConfig(max_format_errors=2),
            )
            await evaluate(client, [task], config)
            llm.set_default(lambda r: {"tool": "shell", "arguments": {"command": "true"}})
            config = _config(
                tmp_path / "busy",
                llm,
                claw_server,
                trials=1,
                harness_config=HarnessConfig(max_steps=3),
            )
            await evaluate(client, [task], config)
    (idle,) = read_jsonl(tmp_path / "idle" / "trajectories.jsonl")
    assert idle.metadata.exit_status == "format_error" and idle.metadata.reward == 0.0
    (busy,) = read_jsonl(tmp_path / "busy" / "trajectories.jsonl")
    assert busy.metadata.exit_status == "step_limit" and busy.metadata.steps == 3
    assert busy.metadata.reward == 0.0 and len(busy.steps) == 3


async def test_tool_failures_are_shown_to_the_model(
    claw_server: RunningServer, tmp_path: Path
) -> None:
    task = TASKS[0]
    replies = [
        {"tool": "read_file", "arguments": {"path": "no/such/file"}},
        {"tool": "nonexistent", "arguments": {}},
        {"tool": "write_file", "arguments": {"path": "notes/new/deep.txt", "content": "hi"}},
        {"tool": "list_dir", "arguments": {"path": "notes/new"}},
        {"tool": "finish", "arguments": {"answer": "stopped"}},
    ]
    with ScriptedModelServer() as llm:
        llm.add(task.id, replies)
        config = _config(tmp_path, llm, claw_server, trials=1)
        async with AsyncSandboxClient(claw_server.url) as client:
            await evaluate(client, [task], config)
    (traj,) = read_jsonl(tmp_path / "trajectories.jsonl")
    assert traj.metadata.exit_status == "submitted" and traj.metadata.final_output == "stopped"
    errors = [s.error for s in traj.steps]
    assert errors[0] and errors[1] and "unknown tool" in errors[1]
    assert errors[2] is None and traj.steps[3].observation["output"].strip() == "deep.txt"

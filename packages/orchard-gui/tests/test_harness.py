"""The ReAct harness end to end: scripted models drive real Chromium in real sandboxes.

Only the model is scripted (the shared scripted chat server, with responders that read the
harness's own prompt); the service, sandboxes, browser, offline sites and checkers are real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from orchard_env_client import AsyncSandboxClient
from orchard_env_client.llm import ModelConfig
from orchard_env_client.testing import ChatRequest, ScriptedModelServer, Step
from orchard_env_client.trajectory import artifact_path, read_jsonl
from orchard_gui.harness import HarnessConfig
from orchard_gui.rollout import rollout_group
from orchard_gui.runner import EvalConfig, evaluate
from orchard_gui.scripted import oracle_responder, read_prompt
from orchard_gui.tasks import load_tasks
from orchard_testing import RunningServer

pytestmark = pytest.mark.integration

OFFLINE = load_tasks("offline")
GAZETTEER = next(t for t in OFFLINE if t.task_id == "local-gazetteer-population")


def _config(out: Path, llm: ScriptedModelServer, **harness: object) -> EvalConfig:
    return EvalConfig(
        out_dir=out,
        model=ModelConfig(model="scripted", base_url=llm.base_url, max_retries=0),
        harness=HarnessConfig(**harness),  # type: ignore[arg-type]
        concurrency=2,
    )


async def test_the_oracle_solves_every_offline_task_through_the_real_browser(
    gui_server: RunningServer, tmp_path: Path
) -> None:
    with ScriptedModelServer() as llm:
        for task in OFFLINE:
            llm.add(task.task_id, oracle_responder(OFFLINE))
        async with AsyncSandboxClient(gui_server.url) as client:
            summary = await evaluate(client, OFFLINE, _config(tmp_path, llm))
            assert await client.list_sandboxes() == []  # every worker's sandbox is gone
    assert summary["episodes"] == len(OFFLINE) >= 12
    failed = [r for r in summary["results"] if r["reward"] != 1.0]
    assert summary["success_rate"] == 1.0, failed
    assert json.loads((tmp_path / "results.json").read_text())["success_rate"] == 1.0
    trajectories = read_jsonl(tmp_path / "trajectories.jsonl")
    for traj in trajectories:
        meta = traj.metadata
        assert (meta.recipe, meta.exit_status, meta.verdict) == ("gui", "submitted", "success")
        assert traj.steps[0].action is None and traj.steps[-1].action["action"] == "done"
        shot = artifact_path(tmp_path, traj.steps[0].artifacts["screenshot"])
        with Image.open(shot) as image:  # a real PNG of the viewport
            assert image.format == "PNG" and image.size == (1280, 720)
        assert (tmp_path / "contact_sheets" / f"{meta.task_id}-0.png").exists()
    # at most the last 3 screenshots go to the model; older ones become a placeholder
    longest = max(llm.requests, key=lambda r: r.n_messages).body["messages"]
    parts = [p for m in longest if isinstance(m["content"], list) for p in m["content"]]
    images = [p for p in parts if p["type"] == "image_url"]
    assert 1 <= len(images) <= 3
    assert all(p["image_url"]["url"].startswith("data:image/png;base64,") for p in images)


async def test_text_actions_format_errors_and_limits(
    gui_local_server: RunningServer, tmp_path: Path
) -> None:
    oracle = oracle_responder([GAZETTEER])
    calls = {"n": 0}

    def flaky_text_oracle(request: ChatRequest) -> Step:
        """The oracle in text form (no tools offered), with a reply without an action
        before every real one."""
        calls["n"] += 1
        if calls["n"] % 2:
            return Step(content="Let me think about where the search box is.")
        step = oracle(request)
        assert not step.tool_calls and "Action: " in step.content
        return step

    with ScriptedModelServer() as llm:
        async with AsyncSandboxClient(gui_local_server.url) as client:
            llm.add(GAZETTEER.task_id, flaky_text_oracle)
            text_run = await evaluate(
                client,
                [GAZETTEER],
                _config(tmp_path / "text", llm, action_format="text", max_steps=12),
            )
            llm.add(GAZETTEER.task_id, ["I do not know."] * 10)
            junk = await evaluate(client, [GAZETTEER], _config(tmp_path / "junk", llm))
            llm.add(
                GAZETTEER.task_id, [{"tool": "scroll", "arguments": {"direction": "down"}}] * 10
            )
            limited = await evaluate(
                client, [GAZETTEER], _config(tmp_path / "lim", llm, max_steps=2)
            )
    assert text_run["success_rate"] == 1.0, text_run["results"]
    (text_traj,) = read_jsonl(tmp_path / "text" / "trajectories.jsonl")
    nudges = [m for m in text_traj.messages if "no usable action" in str(m.get("content"))]
    assert len(nudges) == 4 and text_traj.tools == []
    assert junk["results"][0]["exit_status"] == "format_error" and junk["results"][0]["steps"] == 3
    assert junk["results"][0]["reward"] == 0.0
    assert limited["results"][0]["exit_status"] == "step_limit"
    assert limited["results"][0]["reward"] == 0.0


async def test_a_failing_model_endpoint_is_recorded_not_raised(
    gui_local_server: RunningServer, tmp_path: Path
) -> None:
    with ScriptedModelServer() as llm:  # no script for the task: the endpoint answers 400
        async with AsyncSandboxClient(gui_local_server.url) as client:
            summary = await evaluate(client, [GAZETTEER], _config(tmp_path, llm))
    (row,) = summary["results"]
    assert row["exit_status"].startswith("error: ModelError") and row["reward"] is None


async def test_rollout_groups_use_fresh_sandboxes_and_report_bar_status(
    gui_local_server: RunningServer, tmp_path: Path
) -> None:
    with ScriptedModelServer() as llm:
        llm.add(GAZETTEER.task_id, oracle_responder([GAZETTEER]))
        model = ModelConfig(model="scripted", base_url=llm.base_url)
        async with AsyncSandboxClient(gui_local_server.url) as client:
            group = await rollout_group(client, GAZETTEER, model, 2, tmp_path)
            assert await client.list_sandboxes() == []
    assert [t.metadata.reward for t in group] == [1.0, 1.0]
    assert [t.metadata.attempt for t in group] == [0, 1]
    assert {t.metadata.extra["rollout_status"] for t in group} == {"completed"}
    view_request = ChatRequest(body={"messages": group[0].messages[:2]}, headers={}, key=None)
    assert read_prompt(view_request).instruction == GAZETTEER.instruction

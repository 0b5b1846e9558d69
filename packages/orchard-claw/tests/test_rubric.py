"""The rubric judge: a scripted judge model sees the rubric and the files the run changed,
and its verdict is kept beside the checker's in the trajectory."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard_claw.rubric import judge_prompt
from orchard_claw.runner import EvalConfig, evaluate
from orchard_claw.scripted import reference_responder
from orchard_claw.tasks import builtin_tasks
from orchard_env_client import AsyncSandboxClient
from orchard_env_client.llm import ModelConfig
from orchard_env_client.testing import ChatRequest, ScriptedModelServer
from orchard_env_client.trajectory import read_jsonl
from orchard_testing import RunningServer

TASK = next(t for t in builtin_tasks() if t.rubric and t.kind == "scheduling")


@pytest.mark.fast
def test_the_prompt_holds_instruction_rubric_answer_and_files() -> None:
    text = judge_prompt(TASK, "booked", {"calendar/invite.ics": "BEGIN:VCALENDAR"})
    assert TASK.instruction in text and str(TASK.rubric) in text
    assert "booked" in text and "--- calendar/invite.ics ---\nBEGIN:VCALENDAR" in text


@pytest.mark.integration
async def test_the_judges_verdict_is_kept_beside_the_checkers(
    claw_local_server: RunningServer, tmp_path: Path
) -> None:
    seen: list[str] = []

    def judge(request: ChatRequest) -> str:
        prompt = str(request.messages[-1]["content"])
        seen.append(prompt)
        return "The invite is there.\nVERDICT: PASS" if "invite.ics" in prompt else "VERDICT: FAIL"

    with ScriptedModelServer() as llm, ScriptedModelServer() as judge_llm:
        llm.set_default(reference_responder([TASK]))
        judge_llm.set_default(judge)
        config = EvalConfig(
            out_dir=tmp_path,
            model=ModelConfig(model="scripted", base_url=llm.base_url, max_retries=0),
            image=claw_local_server.image,
            trials=1,
            rubric_judge=ModelConfig(model="judge", base_url=judge_llm.base_url, max_retries=0),
        )
        async with AsyncSandboxClient(claw_local_server.url) as client:
            await evaluate(client, [TASK], config)
    (traj,) = read_jsonl(tmp_path / "trajectories.jsonl")
    assert traj.metadata.reward == 1.0
    assert traj.metadata.extra["rubric"] == {
        "passed": True,
        "reason": "The invite is there.",
        "model": "judge",
    }
    assert len(seen) == 1 and str(TASK.rubric) in seen[0]
    assert not any(f"--- {path} ---" in seen[0] for path in TASK.files)  # unchanged seed files

"""The judges: reply parsing, WebJudge's three stages and the single-call judge against a
scripted model server (the image parts actually sent), and resumable batch judging."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard_env_client.llm import ChatClient, ModelConfig, ModelError
from orchard_env_client.testing import ChatRequest, ScriptedModelServer
from orchard_env_client.trajectory import read_jsonl
from orchard_gui.actions import Action
from orchard_gui.judges import (
    JudgeConfig,
    judge_file,
    judge_trajectory,
    load_prompt,
    parse_key_points,
    parse_score,
    parse_verdict,
)
from orchard_gui.text_actions import format_action

sys.path.insert(0, str(Path(__file__).parent))
from gui_runs import make_run, make_trajectory

pytestmark = pytest.mark.fast

KEY_POINTS = "Key Points:\n1. blue shoes\n2. under $50\n3. report the cheapest price"


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("Thoughts: all good.\nStatus: success", "success"),
        ("Thoughts: ...\n**Status:** FAILURE", "failure"),
        ('Thoughts: x\nStatus: "success"', "success"),
        ("Status: not successful", "failure"),
        ("Verdict - Successful.", "success"),
        ("The agent failed at step 2 but recovered.\nStatus: success", "success"),
        ("Status: failure\n(on reflection)\nStatus: success", "success"),
        ("reasoning...\n\nfailure", "failure"),
        ("The task was a success in spirit.", "unknown"),
        ("", "unknown"),
        ("Status: maybe", "unknown"),
    ],
)
def test_parse_verdict(reply: str, verdict: str) -> None:
    assert parse_verdict(reply) == verdict


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("Reasoning: shows the filter.\nScore: 4", 4),
        ("**Reasoning**: x\n**Score**: 5/5", 5),
        ("Reasoning: x\nScore: 3.5", 4),
        ("I would give it a score of 2.", 2),
        ("Reasoning: nothing here\n1", 1),
        ("Reasoning: lovely page\nScore: 9", None),
        ("no number at all", None),
    ],
)
def test_parse_score(reply: str, score: int | None) -> None:
    assert parse_score(reply) == score


def test_parse_key_points() -> None:
    assert parse_key_points(KEY_POINTS) == ["blue shoes", "under $50", "report the cheapest price"]
    assert parse_key_points("**Key Points**:\n- a\n- b\n") == ["a", "b"]
    assert parse_key_points("Sure.\n\n1) first\n2) second") == ["first", "second"]
    assert parse_key_points("just one line") == ["just one line"]
    assert parse_key_points("") == []


def test_prompts_are_package_data() -> None:
    for name in ("key_points", "screenshot", "verdict", "single"):
        assert load_prompt(f"{name}_system").strip()
        assert "{task}" in load_prompt(f"{name}_user")
    assert load_prompt("verdict_system", JudgeConfig(prompts={"verdict_system": "X"})) == "X"


# ---------------------------------------------------------------- judges


def images_in(body: dict[str, Any]) -> int:
    return sum(
        1
        for m in body.get("messages", [])
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if p.get("type") == "image_url" and p["image_url"]["url"].startswith("data:image/png")
    )


def stage_of(request: ChatRequest) -> str:
    system = str(request.messages[0]["content"])
    for stage in ("key_points", "screenshot", "verdict", "single"):
        if system == load_prompt(f"{stage}_system"):
            return stage
    raise AssertionError(f"unknown prompt: {system[:80]}")


def user_text(request: ChatRequest) -> str:
    content = request.messages[1]["content"]
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content if p.get("type") == "text")


class Judge:
    """A scripted judge model: key points, per-step scores, a verdict reply."""

    def __init__(
        self, scores: dict[int, str], verdict: str = "Thoughts: fine.\nStatus: success"
    ) -> None:
        self.scores = scores
        self.verdict = verdict
        self.fail_tasks: set[str] = set()

    def __call__(self, request: ChatRequest) -> str:
        stage = stage_of(request)
        text = user_text(request)
        for task in self.fail_tasks:
            if task in text:
                raise RuntimeError("judge model down")
        if stage == "key_points":
            return KEY_POINTS
        if stage == "screenshot":
            step = int(re.search(r"after step (\d+)", text).group(1))  # type: ignore[union-attr]
            return self.scores.get(step, "Reasoning: unrelated.\nScore: 1")
        return self.verdict


@pytest.fixture
def server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as srv:
        yield srv


def client_for(server: ScriptedModelServer) -> ChatClient:
    return ChatClient(ModelConfig(model="judge", base_url=server.base_url, max_retries=0))


SCORES = {
    0: "Reasoning: the home page.\nScore: 1",
    1: "**Reasoning**: the search box with text.\n**Score**: 4",
    2: "Reasoning: results for blue shoes, prices visible.\nScore: 5",
    3: "Reasoning: scrolled list.\nScore: 2",
    4: "Reasoning: the cheapest item at $42.\nScore: 3",
}


async def test_webjudge_three_stages(tmp_path: Path, server: ScriptedModelServer) -> None:
    traj = make_trajectory(tmp_path)
    server.set_default(Judge(SCORES))
    async with client_for(server) as client:
        result = await judge_trajectory(traj, tmp_path, client)
    assert result.verdict == "success" and result.reward == 1.0
    assert result.key_points == ["blue shoes", "under $50", "report the cheapest price"]
    assert result.scores == {0: 1, 1: 4, 2: 5, 3: 2, 4: 3}
    assert result.key_screenshots == [1, 2, 4]  # score >= 3, in step order
    # 1 key-point call, 5 screenshots (steps 0-4; the done step has none), 1 verdict
    assert result.calls == 7 and len(result.raw) == 7
    assert result.prompt_tokens > 0 and result.completion_tokens > 0
    stages = [stage_of(ChatRequest(r.body, {}, None)) for r in server.requests]
    assert stages.count("key_points") == 1 and stages.count("screenshot") == 5
    by_stage = {s: images_in(r.body) for s, r in zip(stages, server.requests, strict=True)}
    assert by_stage["key_points"] == 0 and by_stage["screenshot"] == 1
    verdict_request = server.requests[stages.index("verdict")]
    assert images_in(verdict_request.body) == 3
    sent = user_text(ChatRequest(verdict_request.body, {}, None))
    typed = format_action(
        Action.from_dict({"action": "type", "text": "blue shoes", "submit": True})
    )
    assert f"2. {typed} -> http://127.0.0.1:8000/page2" in sent
    assert "Final answer: $42" in sent and "3. report the cheapest price" in sent
    assert "Screenshot after step 2 (relevance 5/5): results for blue shoes" in sent


async def test_webjudge_caps_key_screenshots(tmp_path: Path, server: ScriptedModelServer) -> None:
    traj = make_trajectory(tmp_path)
    server.set_default(Judge(SCORES))
    async with client_for(server) as client:
        result = await judge_trajectory(
            traj, tmp_path, client, config=JudgeConfig(max_key_screenshots=2, max_screenshots=4)
        )
    # step 0 is beyond the 4 most recent; the two best of 1 (4), 2 (5), 4 (3)
    assert sorted(result.scores) == [1, 2, 3, 4]
    assert result.key_screenshots == [1, 2]
    assert images_in(server.requests[-1].body) == 2


async def test_unparseable_replies(tmp_path: Path, server: ScriptedModelServer) -> None:
    traj = make_trajectory(tmp_path)
    scores = {**SCORES, 2: "It is quite relevant, I think."}
    server.set_default(Judge(scores, verdict="Hard to say; the page might show it."))
    async with client_for(server) as client:
        result = await judge_trajectory(traj, tmp_path, client)
    assert result.verdict == "unknown" and result.reward is None
    assert result.scores[2] is None and result.key_screenshots == [1, 4]
    assert any("unreadable screenshot scores" in n for n in result.notes)
    assert any("neither success nor failure" in n for n in result.notes)
    assert result.raw[-1]["content"] == "Hard to say; the page might show it."


async def test_no_relevant_screenshot_and_missing_file(
    tmp_path: Path, server: ScriptedModelServer
) -> None:
    traj = make_trajectory(tmp_path)
    (tmp_path / traj.steps[3].artifacts["screenshot"].path).unlink()
    server.set_default(Judge({}, verdict="Thoughts: nothing shown.\nStatus: failure"))
    async with client_for(server) as client:
        result = await judge_trajectory(traj, tmp_path, client)
    assert result.verdict == "failure" and result.reward == 0.0
    assert result.key_screenshots == [] and 3 not in result.scores and len(result.scores) == 4
    assert any("missing screenshot files" in n and "step 3" in n for n in result.notes)
    assert images_in(server.requests[-1].body) == 0


async def test_single_judge(tmp_path: Path, server: ScriptedModelServer) -> None:
    traj = make_trajectory(tmp_path, answer=None, actions=[{"action": "go_back"}] * 3)
    server.set_default(Judge({}, verdict="Thoughts: never answered.\n**Status**: Failure"))
    async with client_for(server) as client:
        result = await judge_trajectory(
            traj, tmp_path, client, method="single", config=JudgeConfig(last_k=2)
        )
    assert (result.method, result.verdict, result.reward, result.calls) == (
        "single",
        "failure",
        0.0,
        1,
    )
    assert result.key_screenshots == [2, 3]
    (request,) = server.requests
    assert images_in(request.body) == 2
    sent = user_text(ChatRequest(request.body, {}, None))
    assert "did not declare the task done (step_limit)" in sent
    assert "Final answer: (none given)" in sent


async def test_unknown_method(tmp_path: Path, server: ScriptedModelServer) -> None:
    async with client_for(server) as client:
        with pytest.raises(ValueError, match="unknown judge method"):
            await judge_trajectory(make_trajectory(tmp_path), tmp_path, client, method="x")  # type: ignore[arg-type]


async def test_model_error_propagates(tmp_path: Path, server: ScriptedModelServer) -> None:
    judge = Judge(SCORES)
    judge.fail_tasks.add("blue shoes")
    server.set_default(judge)
    async with client_for(server) as client:
        with pytest.raises(ModelError):
            await judge_trajectory(make_trajectory(tmp_path), tmp_path, client, method="single")


# ---------------------------------------------------------------- files


async def test_judge_file_is_resumable(tmp_path: Path, server: ScriptedModelServer) -> None:
    run = make_run(
        tmp_path,
        [
            {"task_id": "a", "instruction": "Task alpha: find blue shoes.", "reward": 1.0},
            {"task_id": "b", "instruction": "Task beta: find red hats."},
            {"task_id": "c", "instruction": "Task gamma: find green socks.", "answer": None},
        ],
    )
    before = run.read_bytes()
    judge = Judge(SCORES, verdict="Thoughts: ok.\nStatus: failure")
    judge.fail_tasks.add("Task beta")
    server.set_default(judge)
    async with client_for(server) as client:
        summary = await judge_file(run, client, method="single", concurrency=2)
        assert summary.out_path == tmp_path / "trajectories.judged-single.jsonl"
        assert (summary.judged, summary.skipped, summary.verdicts) == (2, 0, {"failure": 2})
        assert [f["task_id"] for f in summary.failed] == ["b"]
        assert "ModelError" in summary.failed[0]["error"]
        assert run.read_bytes() == before

        judge.fail_tasks.clear()
        again = await judge_file(run, client, method="single")
        assert (again.judged, again.skipped, again.failed) == (1, 2, [])
        third = await judge_file(run, client, method="single")
        assert (third.judged, third.skipped) == (0, 3)

    judged = {t.metadata.task_id: t for t in read_jsonl(summary.out_path)}
    assert sorted(judged) == ["a", "b", "c"]
    a = judged["a"].metadata
    assert (a.verdict, a.reward) == ("failure", 0.0)
    assert a.extra["judge"]["previous"] == {"reward": 1.0, "verdict": "success"}
    assert a.extra["judge"]["method"] == "single" and a.extra["judge"]["calls"] == 1
    assert a.extra["instruction"] == "Task alpha: find blue shoes."
    assert judged["c"].steps == make_trajectory(tmp_path, task_id="c", answer=None).steps


async def test_judge_file_refuses_other_directories(
    tmp_path: Path, server: ScriptedModelServer
) -> None:
    run = make_run(tmp_path)
    async with client_for(server) as client:
        with pytest.raises(ValueError, match="directory"):
            await judge_file(run, client, tmp_path / "elsewhere" / "out.jsonl")
        with pytest.raises(ValueError, match="new file"):
            await judge_file(run, client, run)


async def test_judge_file_with_a_model_config(tmp_path: Path, server: ScriptedModelServer) -> None:
    run = make_run(tmp_path, [{"task_id": "a"}, {"task_id": "b"}])
    server.set_default(Judge(SCORES))
    config = ModelConfig(model="judge", base_url=server.base_url, max_retries=0)
    summary = await judge_file(run, config, tmp_path / "judged.jsonl")
    assert (summary.judged, summary.verdicts) == (2, {"success": 2})
    # 2 x (1 key-point call + 5 screenshots + 1 verdict)
    assert len(server.requests) == 14
    assert {t.metadata.reward for t in read_jsonl(tmp_path / "judged.jsonl")} == {1.0}

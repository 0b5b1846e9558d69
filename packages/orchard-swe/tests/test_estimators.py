"""Credit-assignment estimators: Monte-Carlo replay in real sandboxes, and the LLM judge.

MC replay runs on a built-in task against a real Orchard server: a trajectory recorded by
the real tools harness (look, write the gold patch to a file, apply it, revert it, submit)
is restored prefix by prefix and continued by scripted policies (submit at once; or, by
the request's seed, apply the gold fix then submit), so every value is known exactly; the
real tiny LLM continues it too. The judge's parsing runs against scripted local servers and
the real tiny LLM.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import attrs
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from orchard_env_client import AsyncSandboxClient
from orchard_env_client.llm import ModelConfig
from orchard_swe.algorithms.credit import CreditConfig, samples_for
from orchard_swe.algorithms.estimators import (
    JudgeConfig,
    JudgeError,
    LLMJudge,
    MonteCarloConfig,
    MonteCarloReplay,
    RecordedAction,
    ReplayError,
    continuation_seed,
    fill_values,
    parse_probability,
    planned_prefixes,
    prefix_end,
    recorded_actions,
    render_prefix,
    terminal_value,
)
from orchard_swe.distill import DistillConfig, run_attempt
from orchard_swe.tasks import BUILTIN, Task, load_tasks
from orchard_swe.testing.replay import (
    Script,
    ScriptedModelServer,
    Step,
    ToolCall,
    gold_script,
    mini_action,
)
from orchard_swe.trajectory import Trajectory, TrajectoryMetadata
from orchard_testing import RunningServer, StubEndpoint, free_port

TASK_ID = "toolz__toolz-1"
APPLIED_AT = 3  # prefix 3 (after look, write, apply) holds the fix; prefix 4 has reverted it


@pytest.fixture
def server(local_server: RunningServer) -> RunningServer:
    """Local only: the estimator's logic is the same on every backend (distill and grading,
    which it uses, are tested on all three)."""
    return local_server


@pytest.fixture(scope="module")
def task() -> Task:
    (found,) = load_tasks(BUILTIN, ids=[TASK_ID])
    return found


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mc-recordings")


# ---------------------------------------------------------------- pure helpers


@pytest.mark.fast
def test_planned_prefixes_and_fill() -> None:
    assert planned_prefixes(5, 1) == [0, 1, 2, 3, 4, 5]
    assert planned_prefixes(5, 2) == [0, 2, 4, 5]
    assert planned_prefixes(0, 3) == [0]
    with pytest.raises(ValueError):
        planned_prefixes(3, 0)
    known = {0: 0.0, 2: 1.0, 4: 0.5, 5: 0.0}
    assert fill_values(5, known) == [0.0, 0.5, 1.0, 0.75, 0.5, 0.0]
    assert fill_values(5, known, "carry") == [0.0, 0.0, 1.0, 1.0, 0.5, 0.0]
    assert fill_values(3, {0: 0.25}) == [0.25] * 4  # nothing after: carried
    with pytest.raises(ValueError):
        fill_values(2, {1: 0.5})


@pytest.mark.fast
def test_seeds_are_stable_and_distinct() -> None:
    a = continuation_seed(0, "x", 0, 1, 0)
    assert a == continuation_seed(0, "x", 0, 1, 0)
    others = {
        continuation_seed(b, i, t, p, k)
        for b, i, t, p, k in [
            (1, "x", 0, 1, 0),
            (0, "y", 0, 1, 0),
            (0, "x", 1, 1, 0),
            (0, "x", 0, 2, 0),
            (0, "x", 0, 1, 1),
        ]
    }
    assert a not in others and len(others) == 5
    assert all(0 <= s < 2**31 for s in [a, *others])


@pytest.mark.fast
def test_recorded_actions_of_both_protocols() -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "ls"}'},
    }
    assert recorded_actions({"role": "assistant", "content": "x", "tool_calls": [call]}) == [
        RecordedAction("bash", '{"command": "ls"}', "c1")
    ]
    text = mini_action("git status", "Look.")
    assert recorded_actions({"role": "assistant", "content": text}) == [
        RecordedAction("bash", {"command": "git status"})
    ]
    two = text + "\n" + mini_action("ls")
    assert recorded_actions({"role": "assistant", "content": two}) == []  # mini: format error
    assert recorded_actions({"role": "assistant", "content": "thinking"}) == []
    assert recorded_actions({"role": "assistant", "content": None}) == []


@pytest.mark.fast
def test_prefix_end_and_terminal_value() -> None:
    msgs = [
        {"role": "system"},
        {"role": "user"},
        {"role": "assistant"},
        {"role": "tool"},
        {"role": "assistant"},
        {"role": "user"},
    ]
    assert [prefix_end(msgs, i) for i in range(3)] == [2, 4, 6]
    with pytest.raises(ValueError):
        prefix_end(msgs, 3)
    meta = TrajectoryMetadata(
        task_id="i", harness="tools", model="m", exit_status="submitted", verdict="unresolved"
    )
    assert terminal_value(Trajectory(metadata=meta)) == 0.0
    assert terminal_value(Trajectory(metadata=attrs.evolve(meta, verdict="resolved"))) == 1.0
    assert terminal_value(Trajectory(metadata=attrs.evolve(meta, exit_status="step_limit"))) is None
    assert terminal_value(Trajectory(metadata=attrs.evolve(meta, verdict=None))) is None


@pytest.mark.fast
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.7", 0.7),
        ("  0.25\n", 0.25),
        (".5", 0.5),
        ("1", 1.0),
        ("0", 0.0),
        ("Probability: 0.83.", 0.83),
        ("I'd say 85%", 0.85),
        ("85 percent", 0.85),
        ("7 out of 10 times; so 0.7", 0.7),  # 7 and 10 are out of range: skipped
        ("-0.2 then 0.4", 0.4),
        ("150% sure, 0.9", 0.9),
        ("version 1.2.3 gives 0.6", 0.6),
        ("gpt4 says 0.3", 0.3),
        ("<think>maybe 0.1? no</think>0.65", 0.65),
        ("5e-1", 0.5),
        ("no idea", None),
        ("", None),
        ("42", None),
        ("nan", None),
    ],
)
def test_parse_probability(text: str, expected: float | None) -> None:
    got = parse_probability(text)
    assert got == pytest.approx(expected) if expected is not None else got is None


@pytest.mark.fast
def test_render_prefix_keeps_the_task_and_cuts_long_outputs() -> None:
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "cat x"}'},
    }
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "SYSTEM"},
        {"role": "user", "content": "fix the bug"},
        {"role": "assistant", "content": "look", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "A" * 5000},
        {"role": "assistant", "content": "done"},
    ]
    task, transcript = render_prefix(msgs, 1, max_message_chars=300)
    assert task == "fix the bug"
    assert "SYSTEM" not in transcript and "done" not in transcript
    assert '<tool_call name="bash">{"command": "cat x"}</tool_call>' in transcript
    assert "characters elided" in transcript and len(transcript) < 600
    assert render_prefix(msgs, 0)[1] == ""


# ---------------------------------------------------------------- judge: scripted servers


def _trajectory(instance_id: str, turns: int = 2, **meta: Any) -> Trajectory:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": f"issue of {instance_id}"},
    ]
    for t in range(turns):
        msgs += [
            {"role": "assistant", "content": mini_action(f"echo {t}")},
            {"role": "user", "content": f"<returncode>0</returncode>\n<output>\n{t}\n</output>"},
        ]
    fields = {"exit_status": "step_limit", "verdict": "unresolved", **meta}
    return Trajectory(
        metadata=TrajectoryMetadata(task_id=instance_id, harness="mini", model="m", **fields),
        messages=msgs,
    )


def _judge(url: str, **config: Any) -> LLMJudge:
    model = ModelConfig(model="judge", base_url=url, max_retries=0)
    return LLMJudge(model, JudgeConfig(**config))


@pytest.mark.integration
async def test_judge_parses_answers_and_re_asks_after_garbage() -> None:
    with ScriptedModelServer() as server:
        server.add("plain", ["0.4"])
        server.add("percent", ["I estimate about 30% chance."])
        server.add("garbage-then-ok", ["Let me think about it.", "0.9"])
        assert await _judge(server.base_url).values(_trajectory("plain")) == [0.4, 0.4, 0.4]
        assert await _judge(server.base_url).values(_trajectory("percent")) == [0.3] * 3
        judge = _judge(server.base_url, retries=1)
        assert await judge.values(_trajectory("garbage-then-ok")) == [0.9] * 3
        # the re-ask carried the bad answer and a reminder (step 1 of the script)
        assert sorted(r.step for r in server.requests[-6:]) == [0, 0, 0, 1, 1, 1]
        assert [a[3] for a in judge.answers] == ["0.9"] * 3


@pytest.mark.integration
async def test_judge_garbage_raises_or_falls_back() -> None:
    with ScriptedModelServer() as server:
        server.add("junk", [Step(content="No number here.")] * 3)
        with pytest.raises(JudgeError) as info:
            await _judge(server.base_url, retries=2).values(_trajectory("junk", turns=1))
        assert info.value.kind == "unparseable" and info.value.answer == "No number here."
        judge = _judge(server.base_url, retries=0, on_unparseable=0.5)
        assert await judge.values(_trajectory("junk", turns=1)) == [0.5, 0.5]
        assert judge.unparsed == 2
        # a script that runs out is a 400: an HTTP error, not garbage
        server.add("short", ["nothing"])
        with pytest.raises(JudgeError) as info:
            await _judge(server.base_url, retries=3).values(_trajectory("short", turns=1))
        assert info.value.kind == "http"


@pytest.mark.integration
async def test_judge_uses_the_verdict_of_a_graded_submission() -> None:
    with ScriptedModelServer() as server:
        server.add("graded", ["0.6"])
        traj = _trajectory("graded", turns=2, exit_status="submitted", verdict="unresolved")
        judge = _judge(server.base_url)
        assert judge.units(traj) == 2
        assert await judge.values(traj) == [0.6, 0.6, 0.0]
        assert len(server.requests) == 2


@pytest.mark.fast
async def test_judge_down_is_a_typed_error() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(JudgeError) as info:
        await _judge(url).values(_trajectory("x", turns=1))
    assert info.value.kind == "unreachable"
    with pytest.raises(ValueError):
        JudgeConfig(on_unparseable=1.5)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_judge_against_the_real_tiny_llm(tiny_llm: str) -> None:
    judge = LLMJudge(
        ModelConfig(model="smollm2", base_url=tiny_llm, max_retries=0),
        JudgeConfig(retries=1, on_unparseable=0.5, max_tokens=12, max_chars=2000, concurrency=2),
    )
    traj = _trajectory("tiny", turns=2)
    values = await judge.values(traj)
    assert len(values) == 3 and all(0.0 <= v <= 1.0 for v in values)
    assert len(judge.answers) + judge.unparsed == 3  # every prefix answered or fell back
    for _, _, _, answer, value in judge.answers:
        assert parse_probability(answer) == value


# ---------------------------------------------------------------- MC replay: a recorded trajectory


def _bash(command: str, thought: str) -> Step:
    return Step(content=thought, tool_calls=(ToolCall("bash", {"command": command}),))


Harness = Literal["tools", "mini"]


def _recording_script(task: Task, harness: Harness) -> list[Step]:
    """look, write the gold patch to a file, apply it, revert it, submit."""
    write, apply, submit = gold_script(task.patch, harness).steps
    if harness == "tools":
        return [_bash("ls", "Look."), write, apply, _bash("git checkout -q -- .", "Undo."), submit]
    return [
        Step(content=mini_action("ls", "Look.")),
        write,
        apply,
        Step(content=mini_action("git checkout -q -- .", "Undo.")),
        submit,
    ]


_RECORDED: dict[tuple[str, str], Trajectory] = {}


async def recorded(
    client: AsyncSandboxClient, task: Task, out: Path, harness: Harness = "tools"
) -> Trajectory:
    """The trajectory the real harness records for the recording script (cached)."""
    key = (client.base_url, harness)
    if key not in _RECORDED:
        with ScriptedModelServer() as model:
            model.add(task.instance_id, _recording_script(task, harness))
            config = DistillConfig(
                harness=harness,
                out_dir=out,
                model=ModelConfig(model="scripted", base_url=model.base_url),
            )
            traj = await run_attempt(client, task, 0, config)
        meta = traj.metadata
        assert meta.exit_status == "submitted" and meta.verdict == "unresolved", meta
        assert len(traj.assistant_messages()) == 5
        _RECORDED[key] = traj
    return _RECORDED[key]


def _submit_now() -> list[Step]:
    return [Step(content="Done.", tool_calls=(ToolCall("submit", {}),))]


async def _ids(client: AsyncSandboxClient) -> set[str]:
    return {s.sandbox_id for s in await client.list_sandboxes()}


@pytest.mark.integration
async def test_mc_restores_each_prefix_exactly(
    client: AsyncSandboxClient, task: Task, out: Path
) -> None:
    """Submitting at once from each restored prefix reads off its state: only the prefix
    with the fix applied resolves; the recording's end takes its verdict."""
    traj = await recorded(client, task, out)
    before = await _ids(client)
    with ScriptedModelServer() as policy:
        policy.add(task.instance_id, Script(_submit_now(), repeat_last=True))
        mc = MonteCarloReplay(
            client,
            [task],
            ModelConfig(model="p", base_url=policy.base_url),
            MonteCarloConfig(k=1, concurrency=4),
        )
        assert mc.units(traj) == 5  # prefixes 0..4; prefix 5 is the graded end
        values = await mc.values(traj)
    assert values == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    stats = mc.stats()
    assert stats["continuations"] == 5 and stats["errors"] == 0 and stats["resolved"] == 1
    assert stats["restored_actions"] == 0 + 1 + 2 + 3 + 4
    assert stats["diverged"] == 0  # every replayed observation equals the recorded one
    assert {(c.prefix, c.exit_status) for c in mc.continuations} == {
        (p, "submitted") for p in range(5)
    }
    assert await _ids(client) == before  # every sandbox deleted
    (sample,) = samples_for(traj, values, CreditConfig(delta=0.5, epsilon=0.05))
    assert sample.segment is not None and (sample.segment.start, sample.segment.stop) == (2, 3)


@attrs.define
class SeededPolicy(StubEndpoint):
    """A chat server choosing by the request's seed: even → apply the gold fix and submit,
    odd → submit at once. Records (assistant turns in the request, seed); can stall."""

    fix: str
    delay_s: float = 0.0
    seen: list[tuple[int, int]] = attrs.field(factory=list)

    async def _chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        turns = sum(m.get("role") == "assistant" for m in body["messages"])
        seed = int(body["seed"])
        self.seen.append((turns, seed))
        await asyncio.sleep(self.delay_s)
        calls = [{"name": "bash", "arguments": {"command": self.fix}}] if seed % 2 == 0 else []
        calls.append({"name": "submit", "arguments": {}})
        message = {
            "role": "assistant",
            "content": "ok",
            "tool_calls": [
                {
                    "id": f"c{seed}_{i}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                }
                for i, c in enumerate(calls)
            ],
        }
        return JSONResponse(
            {
                "choices": [{"message": message, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1},
            }
        )

    def routes(self) -> list[Route]:
        return [Route("/v1/chat/completions", self._chat, methods=["POST"])]


def _fix_command(task: Task) -> str:
    write, apply, _ = gold_script(task.patch, "tools").steps
    commands = [step.tool_calls[0].arguments for step in (write, apply)]
    assert all(isinstance(c, Mapping) for c in commands)
    return "\n".join(str(c["command"]) for c in commands if isinstance(c, Mapping))


@pytest.mark.integration
async def test_mc_values_are_resolved_fractions_with_seeds_and_stride(
    client: AsyncSandboxClient, task: Task, out: Path
) -> None:
    traj = await recorded(client, task, out)
    before = await _ids(client)
    config = MonteCarloConfig(k=4, stride=4, seed=11, concurrency=4)
    with SeededPolicy(_fix_command(task)) as policy:
        model = ModelConfig(model="p", base_url=policy.base_url, temperature=1.0)
        mc = MonteCarloReplay(client, [task], model, config)
        values = await mc.values(traj)
    assert await _ids(client) == before
    seeds = {p: [continuation_seed(11, TASK_ID, 0, p, j) for j in range(4)] for p in (0, 4)}
    assert sorted(policy.seen) == sorted((p, s) for p, ss in seeds.items() for s in ss)
    even = {p: sum(s % 2 == 0 for s in ss) / 4 for p, ss in seeds.items()}
    # estimated: 0 and 4 (the fraction of gold-choosing seeds); 5 is the verdict; 1-3 are
    # interpolated
    step = (even[4] - even[0]) / 4
    assert values == pytest.approx(
        [even[0], even[0] + step, even[0] + 2 * step, even[0] + 3 * step, even[4], 0.0]
    )
    assert all(0.0 <= v <= 1.0 for v in values) and len(values) == 6
    assert mc.stats()["errors"] == 0 and mc.stats()["diverged"] == 0


@pytest.mark.integration
async def test_mc_cancelled_midway_leaves_no_sandbox(
    client: AsyncSandboxClient, task: Task, out: Path
) -> None:
    traj = await recorded(client, task, out)
    before = await _ids(client)
    with SeededPolicy(_fix_command(task), delay_s=60) as policy:
        mc = MonteCarloReplay(
            client,
            [task],
            ModelConfig(model="p", base_url=policy.base_url),
            MonteCarloConfig(k=1, concurrency=3),
        )
        job = asyncio.ensure_future(mc.values(traj))
        deadline = time.monotonic() + 60
        while len(policy.seen) < 3:  # three continuations are waiting for the policy
            assert time.monotonic() < deadline and not job.done()
            await asyncio.sleep(0.1)
        assert len(await _ids(client) - before) == 3
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
    assert await _ids(client) == before


@pytest.mark.integration
async def test_mc_unreachable_policy_fails_clearly(
    client: AsyncSandboxClient, task: Task, out: Path
) -> None:
    traj = await recorded(client, task, out)
    before = await _ids(client)
    dead = ModelConfig(model="p", base_url=f"http://127.0.0.1:{free_port()}/v1", max_retries=0)
    mc = MonteCarloReplay(client, [task], dead, MonteCarloConfig(k=1, stride=5))
    with pytest.raises(ReplayError, match=r"all 1 continuations of prefix 0 failed.*ModelError"):
        await mc.values(traj)
    assert await _ids(client) == before
    with pytest.raises(ReplayError, match="no such task"):
        await MonteCarloReplay(client, [], dead).values(traj)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_mc_with_the_real_tiny_llm_policy(
    client: AsyncSandboxClient, task: Task, out: Path, tiny_llm: str
) -> None:
    traj = await recorded(client, task, out)
    before = await _ids(client)
    model = ModelConfig(
        model="smollm2", base_url=tiny_llm, temperature=0.7, max_tokens=32, max_retries=0
    )
    mc = MonteCarloReplay(client, [task], model, MonteCarloConfig(k=1, stride=5, max_steps=2))
    values = await mc.values(traj)
    assert len(values) == 6 and all(0.0 <= v <= 1.0 for v in values) and values[-1] == 0.0
    (run,) = mc.continuations
    assert run.error is None and run.prefix == 0 and run.exit_status in ("submitted", "step_limit")
    assert await _ids(client) == before


@pytest.mark.integration
@pytest.mark.slow
async def test_mc_replays_and_resumes_mini_swe_agent(
    client: AsyncSandboxClient, task: Task, out: Path
) -> None:
    """A mini-swe-agent trajectory: its fenced commands are replayed, and mini's own agent
    continues from the prefix (submitting at once)."""
    traj = await recorded(client, task, out, "mini")
    before = await _ids(client)
    submit = Step(content=mini_action("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "Done."))
    with ScriptedModelServer() as policy:
        policy.add(task.instance_id, Script([submit], repeat_last=True))
        mc = MonteCarloReplay(
            client,
            [task],
            ModelConfig(model="p", base_url=policy.base_url),
            MonteCarloConfig(k=1, concurrency=3),
        )
        values = await mc.values(traj)
    assert values == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert mc.stats()["diverged"] == 0 and mc.stats()["errors"] == 0
    assert {c.exit_status for c in mc.continuations} == {"submitted"}
    assert await _ids(client) == before

"""Framework-neutral rollouts in a real Orchard sandbox: token bookkeeping, logprobs, reward.

A scripted token-in/token-out ``/generate`` server (here, on 127.0.0.1) checks the
bookkeeping exactly and earns both rewards on the ``calc`` task; the real tiny model
(SmolLM2-135M behind ``tiny_llm_server``) runs both policies for a few turns.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

import attrs
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from orchard_env_client import AsyncSandboxClient
from orchard_swe.algorithms.bar import Status
from orchard_swe.algorithms.rollout import (
    ChatPolicy,
    ChatTokens,
    RolloutConfig,
    RolloutTrajectory,
    TokenPolicy,
    parse_action,
    rollout,
    token_ids_from_logprobs,
)
from orchard_swe.data.sft_data import ChatRenderer
from orchard_swe.data.tokenizer import load_tokenizer
from orchard_swe.tasks import Task
from orchard_testing import RunningServer, StubEndpoint

pytestmark = pytest.mark.integration

FIX = (
    "cat > calc.py <<'EOF'\ndef add(a, b):\n    return a + b\n\n\n"
    "def mul(a, b):\n    return a * b\nEOF"
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("smollm2")


@pytest.fixture(scope="module")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = RunningServer(backend="local", state_dir=tmp_path_factory.mktemp("rollout") / "s")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
async def sandboxes(local_server: RunningServer) -> AsyncIterator[AsyncSandboxClient]:
    async with AsyncSandboxClient(base_url=local_server.url) as c:
        yield c


# ---------------------------------------------------------------- a scripted /generate server


@attrs.define
class Reply:
    ids: list[int]
    logprobs: list[float]
    finish: str = "stop"


@attrs.define
class ScriptedGenerate(StubEndpoint):
    """``POST /generate`` answering a script of replies in order; 500 once it runs out."""

    script: list[Reply]
    requests: list[dict[str, Any]] = attrs.field(factory=list)

    async def _generate(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        if not self.script:
            return JSONResponse({"error": "the script is over"}, status_code=500)
        reply = self.script.pop(0)
        return JSONResponse(
            {
                "output_ids": reply.ids,
                "output_logprobs": reply.logprobs,
                "finish_reason": reply.finish,
            }
        )

    def routes(self) -> list[Route]:
        return [Route("/generate", self._generate, methods=["POST"])]


def _reply(tokenizer: Any, text: str, *, end: bool = True, split: bool = False) -> Reply:
    """A completion as token ids (+ <|im_end|>), with made-up but exact logprobs.

    ``split`` spells one token as two smaller ones, as a sampler may: the text is the same,
    but re-tokenising it gives other ids than the model produced.
    """
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if split:
        vocab = tokenizer.get_vocab()
        for k, tid in enumerate(ids):
            piece = tokenizer.convert_ids_to_tokens(tid)
            halves = [(piece[:c], piece[c:]) for c in range(1, len(piece))]
            found = next(((a, b) for a, b in halves if a in vocab and b in vocab), None)
            if found is not None:
                ids[k : k + 1] = [vocab[found[0]], vocab[found[1]]]
                break
        else:
            raise AssertionError("no token to split")
    if end:
        ids.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    logprobs = [-0.01 * (i + 1) for i in range(len(ids))]
    return Reply(ids, logprobs, "stop" if end else "length")


def _check_bookkeeping(traj: RolloutTrajectory, sent: list[list[int]], tokenizer: Any) -> None:
    """What was sent each turn is exactly the recorded context; masks cover completions only."""
    assert len(sent) == len(traj.turns)
    context: list[int] = []
    for turn, request in zip(traj.turns, sent, strict=True):
        context += turn.prompt_ids
        assert request == context  # no re-tokenisation between turns
        context += turn.completion_ids
        assert len(turn.logprobs) == len(turn.loss_mask) == len(turn.completion_ids)
        assert turn.loss_mask == [1] * len(turn.completion_ids)
    ids, mask, logprobs = traj.input_ids(), traj.loss_mask(), traj.logprobs()
    assert ids == context  # the concatenated turns are the final context
    assert len(mask) == len(logprobs) == len(ids)
    trained = [t for t, m in zip(ids, mask, strict=True) if m]
    assert trained == [t for turn in traj.turns for t in turn.completion_ids]
    # the ids are the template's text of the conversation, up to the last completion
    renderer = ChatRenderer(tokenizer)
    text = renderer.decode(ids)
    assert renderer.render(traj.messages, []).startswith(text)
    verl, slime = traj.to_verl(), traj.to_slime()
    assert verl["prompt_ids"] + verl["response_ids"] == ids == slime["tokens"]
    assert (
        len(verl["response_mask"]) == slime["response_length"] == len(ids) - len(verl["prompt_ids"])
    )
    assert RolloutTrajectory.from_dict(traj.to_dict()) == traj


async def test_token_rollout_has_no_drift_carries_logprobs_and_earns_the_reward(
    tokenizer: Any, sandboxes: AsyncSandboxClient, calc_task: Task
) -> None:
    script = [
        _reply(tokenizer, "Let me look at the code first.\n```bash\ncat calc.py\n```", split=True),
        _reply(tokenizer, "Both are wrong; rewrite them.\n```bash\n" + FIX + "\n```", end=False),
        _reply(tokenizer, "```bash\npython3 -c 'import calc; print(calc.add(-1, 2))'\n```"),
        _reply(tokenizer, "Fixed.\n```bash\nsubmit\n```"),
    ]
    expected = [(r.ids, r.logprobs) for r in script]
    with ScriptedGenerate(list(script)) as server:
        policy = TokenPolicy(server.url, tokenizer, temperature=0.7, seed=3)
        traj = await rollout(calc_task, policy, sandboxes, RolloutConfig(max_turns=8))
        await policy.aclose()
    assert traj.error is None
    assert traj.status == Status.COMPLETED
    assert traj.grade_status == "resolved" and traj.reward == 1.0
    assert "return a + b" in traj.patch
    sent = [r["input_ids"] for r in server.requests]
    _check_bookkeeping(traj, sent, tokenizer)
    assert policy.requests == sent
    assert server.requests[0]["sampling_params"]["temperature"] == 0.7
    # the ids and logprobs are the server's, exactly
    assert [(t.completion_ids, t.logprobs) for t in traj.turns] == expected
    # turn 0 was spelled unusually: re-tokenising its text would have drifted
    first = traj.turns[0]
    assert (
        ChatRenderer(tokenizer).encode(first.text) + first.completion_ids[-1:]
        != first.completion_ids
    )
    # turn 1 was cut by length: the template's <|im_end|> was added as prompt, not trained
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert traj.turns[1].finish_reason == "length"
    assert traj.turns[2].prompt_ids[:2] == [im_end, *tokenizer("\n")["input_ids"]]
    assert traj.turns[1].completion_ids[-1] != im_end
    # observations came from the sandbox
    assert "return a + b if a > 0 else a - b" in traj.messages[3]["content"]
    assert "<returncode>0</returncode>" in traj.messages[7]["content"]
    assert "\n1\n" in traj.messages[7]["content"]  # add(-1, 2) after the fix
    assert traj.to_bar_sample().reward == 1.0


async def test_unsolved_truncated_and_aborted_rollouts(
    tokenizer: Any, sandboxes: AsyncSandboxClient, calc_task: Task
) -> None:
    give_up = [_reply(tokenizer, "```bash\nsubmit\n```")]
    with ScriptedGenerate(give_up) as server:
        traj = await rollout(calc_task, TokenPolicy(server.url, tokenizer), sandboxes)
    assert traj.status == Status.COMPLETED and traj.reward == 0.0
    assert traj.patch == "" and traj.grade_status == "unresolved"
    wander = [_reply(tokenizer, "I think."), _reply(tokenizer, "```bash\nls\n```")]
    with ScriptedGenerate(wander) as server:
        traj = await rollout(
            calc_task, TokenPolicy(server.url, tokenizer), sandboxes, RolloutConfig(max_turns=2)
        )
        _check_bookkeeping(traj, [r["input_ids"] for r in server.requests], tokenizer)
    assert traj.status == Status.TRUNCATED and traj.reward == 0.0 and traj.grade_status is None
    assert "no ```bash block" in traj.messages[3]["content"]  # a reply without a command
    with ScriptedGenerate([_reply(tokenizer, "```bash\nls\n```")]) as server:
        traj = await rollout(calc_task, TokenPolicy(server.url, tokenizer), sandboxes)
    assert traj.status == Status.ABORTED and "HTTP 500" in (traj.error or "")
    assert len(traj.turns) == 1 and traj.reward == 0.0
    to = [_reply(tokenizer, "```bash\nsleep 5\n```")]
    with ScriptedGenerate(to) as server:
        traj = await rollout(
            calc_task,
            TokenPolicy(server.url, tokenizer),
            sandboxes,
            RolloutConfig(max_time_s=3.0, command_timeout_s=60),
        )
    assert traj.status == Status.TIME_EXCEEDED
    assert traj.to_slime()["status"] == "truncated"


def test_actions_and_logprob_tokens(tokenizer: Any) -> None:
    assert parse_action("ok\n```bash\nls -la\n```\nthen") == "ls -la"
    assert parse_action("```bash\nsubmit\n```") == "submit"
    assert parse_action("```\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```") == "submit"
    assert parse_action("```bash\ncat x") == "cat x"  # an unclosed last block
    assert parse_action("no command") is None and parse_action("```bash\n\n```") is None
    ids = list(tokenizer("héllo 🍎 wörld<|im_end|>", add_special_tokens=False)["input_ids"])
    raw = [tokenizer.convert_ids_to_tokens(t) for t in ids]
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    dec = {c: b for b, c in bytes_to_unicode().items()}
    content = [
        {"token": "x", "bytes": list(p.encode()) if p.startswith("<|") else [dec[c] for c in p]}
        for p in raw
    ]
    assert token_ids_from_logprobs(content, tokenizer) == ids
    assert token_ids_from_logprobs([{"token": f"token_id:{t}"} for t in ids], tokenizer) == ids
    assert token_ids_from_logprobs([{"token": "?", "bytes": [0, 1, 2, 3, 4, 5]}], tokenizer) is None


# ---------------------------------------------------------------- the real tiny model


@pytest.mark.timeout(900)
async def test_both_policies_with_the_real_tiny_model(
    tokenizer: Any, sandboxes: AsyncSandboxClient, calc_task: Task, tiny_llm: str
) -> None:
    cfg = RolloutConfig(max_turns=2, max_new_tokens=32, grade=False)
    token_policy = TokenPolicy(tiny_llm, tokenizer, temperature=0.0)
    traj = await rollout(calc_task, token_policy, sandboxes, cfg)
    await token_policy.aclose()
    assert traj.error is None, traj.error
    assert traj.status in (Status.TRUNCATED, Status.COMPLETED)
    _check_bookkeeping(traj, token_policy.requests, tokenizer)
    for turn in traj.turns:
        assert 0 < len(turn.completion_ids) <= 32
        assert all(math.isfinite(lp) and lp <= 0 for lp in turn.logprobs)
        assert turn.text == tokenizer.decode(turn.completion_ids, skip_special_tokens=True)

    chat_policy = ChatPolicy(tiny_llm, tokenizer, temperature=0.0, model="smollm2")
    chat = await rollout(calc_task, chat_policy, sandboxes, cfg)
    await chat_policy.aclose()
    assert chat.error is None, chat.error
    first = chat.turns[0]
    assert not first.drift  # the server rendered the same prompt as the local template
    # greedy: the chat endpoint generated exactly what /generate did from the same prompt,
    # and the ids recovered from its logprobs' bytes are those ids
    assert first.prompt_ids == traj.turns[0].prompt_ids
    assert first.completion_ids == traj.turns[0].completion_ids
    assert first.logprobs == pytest.approx(traj.turns[0].logprobs, abs=1e-4)
    as_ids = ChatPolicy(tiny_llm, tokenizer, temperature=0.0, tokens_as_ids=True)
    again = await as_ids.generate(list(first.prompt_ids), chat.messages[:2], 32)
    await as_ids.aclose()
    assert again.completion_ids == first.completion_ids
    ChatTokens(tokenizer)  # the template can be bookkept

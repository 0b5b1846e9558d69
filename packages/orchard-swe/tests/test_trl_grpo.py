"""GRPO (TRL) with BAR groups and rewards from Orchard sandboxes, run for real.

A local Orchard Env server of this module's own counts every exec server-side
(``/metrics``). The sandbox side (tasks, executor, reward function) runs here, without
torch; the training runs through ``orchard-swe train-grpo`` in the training venv (TRL 1.16
on CPU torch): a random tiny Llama with SmolLM2's tokenizer, three steps. The checks are
about mechanics, not accuracy: every reward TRL trained on came from a sandbox execution,
every group is the one :func:`~orchard_swe.algorithms.bar.decide` chooses for the recorded
rewards, gradients flowed exactly on the steps that had a learning signal, the weights
changed, and no sandbox was left behind.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchard_env_client import AsyncSandboxClient
from orchard_swe import cli
from orchard_swe.algorithms.bar import (
    BarConfig,
    DropUniform,
    GenerateMore,
    Sample,
    Selection,
    Status,
    ZeroLoss,
    decide,
    select,
)
from orchard_swe.trainers.llm_venv import TORCH_WHEEL, LLMVenvError, ensure_train_venv
from orchard_swe.trainers.trl_grpo import (
    EXPR_PROGRAM,
    SANDBOX_LABELS,
    Completion,
    Execution,
    ExprTask,
    GrpoRunConfig,
    OrchardUnavailable,
    SandboxExecutor,
    SandboxReward,
    trl_rows,
)
from orchard_testing import RunningServer, free_port

ODD, TWELVE = ExprTask(1, 2), ExprTask(12)


@pytest.fixture(scope="module")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    srv = RunningServer(backend="local", state_dir=tmp_path_factory.mktemp("grpo") / "s")
    srv.start()
    yield srv
    srv.stop()


def requests_count(url: str, method: str, route: str) -> int:
    """How many ``method route`` requests the server has answered (its own counter)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    prefix = f'orchard_http_requests_total{{method="{method}",route="{route}",status="'
    return int(
        sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))
    )


def execs(url: str) -> int:
    return requests_count(url, "POST", "/sandboxes/{sandbox_id}/exec")


async def labelled_sandboxes(url: str) -> list[str]:
    async with AsyncSandboxClient(base_url=url, auto_cleanup=False) as client:
        return [s.sandbox_id for s in await client.list_sandboxes(labels=SANDBOX_LABELS)]


# ---------------------------------------------------------------- the sandbox side, no torch


@pytest.mark.fast
def test_tasks_and_config() -> None:
    assert ExprTask.parse("1%2") == ODD and ExprTask.parse("12") == TWELVE
    assert "odd integer" in ODD.prompt and "equal to 12" in TWELVE.prompt
    assert "multiple of 3" in ExprTask.parse("0%3").prompt
    assert ExprTask.parse("4%3").satisfied_by(-2) and not ExprTask.parse("4%3").satisfied_by(4 + 1)
    with pytest.raises(ValueError):
        ExprTask.parse("x")
    cfg = GrpoRunConfig(steps=2, tasks=["1%2", "12"], eligible="completed")
    assert GrpoRunConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert cfg.bar_config().eligible == frozenset({Status.COMPLETED})
    with pytest.raises(ValueError):
        GrpoRunConfig(n=4, n_max=2)
    with pytest.raises(ValueError):
        GrpoRunConfig(tasks=["1%2", "3%2"])  # the same prompt twice


@pytest.mark.fast
def test_bar_groups_become_trl_rows_with_their_loss_weights() -> None:
    cfg = BarConfig(n=4, n_max=8, stride=4, profile="orchard")  # ascending groups, a fallback

    def sample(k: int, reward: float) -> Sample:
        completion = Completion(
            ids=[10 + k] * (k + 1), logprobs=[-0.5] * (k + 1), text=str(k), finished=True
        )
        execution = Execution(answer=str(k), reward=reward, job_id=f"job-{k}")
        return Sample(reward, payload=(completion, execution))

    samples = [sample(k, r) for k, r in enumerate([0.0, 1.0, 0.0, 0.0, 1.0, 0.0])]
    selection = decide(samples, cfg)
    assert isinstance(selection, Selection) and selection.indices == (0, 1, 2, 4)
    kept = trl_rows(select(samples, selection, cfg, [DropUniform()]), [1, 2, 3], cfg.n)
    assert kept["orchard_reward"] == [0.0, 1.0, 0.0, 1.0]  # the chosen samples, in order
    assert kept["orchard_job_id"] == ["job-0", "job-1", "job-2", "job-4"]
    assert kept["completion_ids"][3] == [14] * 5 and kept["prompt_ids"] == [[1, 2, 3]] * 4
    assert kept["env_mask"] == [[1] * len(ids) for ids in kept["completion_ids"]]
    zeroed = trl_rows(select(samples, selection, cfg, [ZeroLoss.negatives()]), [1], cfg.n)
    assert [m[0] for m in zeroed["env_mask"]] == [0, 1, 0, 1]  # negatives: baseline only
    assert zeroed["orchard_reward"] == kept["orchard_reward"]  # still in the group's mean
    negatives = [sample(k, 0.0) for k in range(8)]
    fallback = decide(negatives, cfg, requested=8)
    assert isinstance(fallback, Selection) and fallback.outcome == "fallback"
    dropped = trl_rows(select(negatives, fallback, cfg, [DropUniform()]), [1], cfg.n)
    assert all(set(m) == {0} for m in dropped["env_mask"])  # no loss, no tokens counted
    with pytest.raises(RuntimeError, match="TRL needs 4"):
        trl_rows(select(samples[:2], Selection((0, 1), "fallback", None), cfg), [1], cfg.n)


@pytest.mark.integration
async def test_answers_are_executed_in_a_sandbox_that_is_then_deleted(
    local_server: RunningServer,
) -> None:
    url = local_server.url
    executor = SandboxExecutor(url, "host", exec_timeout_s=1.0)
    assert await executor.check() == "local"
    before = execs(url)
    # The text alone would mislead: "3+4" ends in an even digit but is odd, "1--2" is 3,
    # "3*4" is 12 and "12.0" is not an int; "3+" does not parse; the power does not finish.
    answers = [
        (ODD, "3+4"),
        (ODD, "2*4"),
        (ODD, "1--2"),
        (ODD, "3+"),
        (TWELVE, "3*4"),
        (TWELVE, "12.0"),
        (ODD, "9**9**9**9"),
    ]
    runs = await executor.run(answers)
    assert [r.reward for r in runs] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    assert [r.stdout for r in runs[:3]] == ["7\n", "8\n", "3\n"]
    assert runs[3].exit_code == 1 and "SyntaxError" in runs[3].stderr
    assert runs[6].timed_out and runs[6].status == Status.TIME_EXCEEDED
    assert [r.status for r in runs[:6]] == [Status.COMPLETED] * 6
    (sandbox,) = executor.sandboxes_created
    assert executor.sandboxes_deleted == [sandbox]
    assert all(r.sandbox_id == sandbox and r.job_id and r.job_id.startswith(sandbox) for r in runs)
    assert len({r.job_id for r in runs}) == len(runs)
    assert execs(url) - before == len(answers)  # counted by the server
    assert sorted(executor.executions, key=runs.index) == runs  # recorded as they finish
    assert await labelled_sandboxes(url) == []


@pytest.mark.integration
def test_the_reward_function_executes_unless_the_rollout_already_did(
    local_server: RunningServer,
) -> None:
    url = local_server.url
    executor = SandboxExecutor(url, "host")
    reward = SandboxReward({ODD.prompt: ODD}, executor)
    prompts = [[{"role": "user", "content": ODD.prompt}]] * 3
    completions = [[{"role": "assistant", "content": a}] for a in ("3+4", " 2*4\n", "x")]
    before = execs(url)
    assert reward(prompts=prompts, completions=completions) == [1.0, 0.0, 0.0]
    assert execs(url) - before == 3
    assert reward.calls[-1]["source"] == "executed" and all(reward.calls[-1]["job_ids"])
    given = reward(
        prompts=prompts,
        completions=completions,
        orchard_reward=[0.0, 1.0, 0.0],
        orchard_job_id=["a", "b", "c"],
    )
    assert given == [0.0, 1.0, 0.0] and reward.calls[-1]["source"] == "rollout"
    assert execs(url) - before == 3  # not executed twice
    assert asyncio.run(labelled_sandboxes(url)) == []


@pytest.mark.integration
def test_no_server_is_a_clear_error(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(OrchardUnavailable, match=f"no Orchard Env server answers at {dead}"):
        asyncio.run(SandboxExecutor(dead, "host").check())
    assert cli.main(["train-grpo", "--server-url", dead, "--out", str(tmp_path)]) == 3
    assert not (tmp_path / "report.json").exists()  # the worker never started


# ---------------------------------------------------------------- GRPO steps in the training venv


def _replay_bar(group: dict[str, Any], cfg: BarConfig) -> None:
    """The recorded strides and group are exactly what ``decide`` does on these rewards."""
    samples = [Sample(s["reward"], Status(s["status"])) for s in group["samples"]]
    seen: list[Sample] = []
    requested = 0
    for stride in group["strides"]:
        assert decide(seen, cfg, requested=requested) == GenerateMore(stride)
        requested += stride
        seen = samples[:requested]
    assert seen == samples and requested == group["requested"] <= cfg.n_max
    bounds = tuple(group["bounds"]) if group["bounds"] is not None else None
    assert decide(samples, cfg, requested=requested) == Selection(
        tuple(group["chosen"]), group["outcome"], bounds
    )
    chosen = [samples[i] for i in group["chosen"]]
    assert len(chosen) == cfg.n
    positives = sum(1 for s in chosen if cfg.is_positive(s))
    assert group["positives"] == positives and group["positive_ratio"] == positives / cfg.n
    if group["outcome"] == "found":
        assert cfg.p_min <= positives / cfg.n <= cfg.p_max
        if cfg.profile == "orchard":
            assert all(s.status in cfg.eligible for s in chosen)
        else:  # the reference's backfill never forms a bounded group
            assert all(s.status in (Status.COMPLETED, Status.TRUNCATED) for s in chosen)
    uniform = positives in (0, cfg.n)
    assert (group["dropped_by"] == "DropUniform") == uniform  # the filter: drop all-0 / all-1
    assert group["weights"] == [0.0 if uniform else 1.0] * cfg.n  # TRL's env_mask


def _local_value(answer: str) -> str | None:
    """The answer evaluated by this machine's python, as the sandbox's program prints it."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", EXPR_PROGRAM, answer], capture_output=True, text=True, timeout=5
        )
    except subprocess.TimeoutExpired:
        return None
    return done.stdout if done.returncode == 0 else ""


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grpo_steps_with_bar_groups_and_sandbox_rewards(
    local_server: RunningServer, tmp_path: Path
) -> None:
    if not TORCH_WHEEL.is_file():
        pytest.skip(f"no CPU torch wheel at {TORCH_WHEEL} on this machine")
    try:
        ensure_train_venv()
    except LLMVenvError as exc:
        pytest.fail(f"cannot build the training venv: {exc}")
    url, out = local_server.url, tmp_path / "run"
    before = {
        "execs": execs(url),
        "created": requests_count(url, "POST", "/sandboxes"),
        "deleted": requests_count(url, "DELETE", "/sandboxes/{sandbox_id}"),
    }
    argv = [
        "train-grpo",
        "--server-url",
        url,
        "--image",
        "host",
        "--out",
        str(out),
        "--model",
        "random-tiny",
        "--steps",
        "3",
        "--seed",
        "0",
    ]
    assert cli.main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    cfg = GrpoRunConfig.from_dict(report["config"])
    bar_cfg = cfg.bar_config()
    steps, totals = report["steps"], report["totals"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert report["model"]["kind"] == "random-tiny" and report["versions"]["trl"] == "1.16.0"

    # Every reward came from an execution the server counted, and one execution per sample.
    groups = [g for s in steps for g in s["groups"]]
    samples = [x for g in groups for x in g["samples"]]
    assert len(groups) == cfg.steps * cfg.prompts_per_step
    assert execs(url) - before["execs"] == totals["sandbox_execs"] == len(samples)
    assert len({x["job_id"] for x in samples}) == len(samples)
    assert all(x["job_id"].startswith(x["sandbox_id"]) for x in samples)
    for x, task in ((x, ExprTask.parse(g["task"])) for g in groups for x in g["samples"]):
        if x["timed_out"]:
            assert x["reward"] == 0.0 and x["status"] == "time_exceeded"
            continue
        value = x["stdout"].strip()
        expected = (
            1.0
            if x["exit_code"] == 0
            and re.fullmatch(r"-?\d+", value)
            and task.satisfied_by(int(value))
            else 0.0
        )
        assert x["reward"] == expected, x
        assert _local_value(x["answer"]) == x["stdout"], x  # it really was evaluated
    assert any(x["reward"] == 1.0 for x in samples) and any(x["reward"] == 0.0 for x in samples)

    # TRL trained on exactly BAR's groups: n rows per prompt, the rewards of the chosen samples.
    first_signal = None
    for step in steps:
        assert step["reward_source"] == ["rollout"]
        rows = [g["samples"][i]["reward"] for g in step["groups"] for i in g["chosen"]]
        assert step["trl_rewards"] == rows and len(rows) == cfg.n * cfg.prompts_per_step
        for group in step["groups"]:
            _replay_bar(group, bar_cfg)
        signal = any(g["dropped_by"] is None for g in step["groups"])  # a mixed, kept group
        # Gradients flow exactly on steps with a learning signal (dropped groups are masked).
        assert (step["grad_norm"] > 0) == signal, step
        if signal and first_signal is None:
            first_signal = step["step"]
        if first_signal is None:
            assert step["param_delta_norm"] == 0.0  # nothing moved the weights yet
        else:
            assert step["param_delta_norm"] > 0  # (AdamW's momentum moves them afterwards)
    assert first_signal is not None, "no step had a mixed group: pick another seed"
    assert totals["param_change_norm"] > 0
    assert {g["outcome"] for g in groups} >= {"found"}

    # Every sandbox was deleted: the worker's record, the server's counters, the server's list.
    assert totals["sandboxes_created"] == totals["sandboxes_deleted"] == cfg.steps
    assert requests_count(url, "POST", "/sandboxes") - before["created"] == cfg.steps
    assert requests_count(url, "DELETE", "/sandboxes/{sandbox_id}") - before["deleted"] == cfg.steps
    assert totals["sandboxes_left"] == 0 and asyncio.run(labelled_sandboxes(url)) == []

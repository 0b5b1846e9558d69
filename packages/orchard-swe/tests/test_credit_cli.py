"""``orchard-swe credit-sft`` end to end: bad input, unreachable services, the judge against a
scripted endpoint, and Monte-Carlo replay on a trajectory ``orchard-swe distill`` records
with a real Orchard server; the output goes through ``orchard-swe sft-data --verify``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import attrs
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from orchard_env_client.llm import INSTANCE_ID_HEADER
from orchard_swe.cli import main
from orchard_swe.tasks import BUILTIN, load_tasks
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


@pytest.fixture
def server(local_server: RunningServer) -> RunningServer:
    """Local only: the estimator's logic is the same on every backend (distill and grading,
    which it uses, are tested on all three)."""
    return local_server


def _trajectory(instance_id: str, turns: int, verify: str = "unresolved") -> Trajectory:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": f"Fix {instance_id}."},
    ]
    for t in range(turns):
        msgs += [
            {"role": "assistant", "content": mini_action(f"echo step {t}", f"Step {t}.")},
            {
                "role": "user",
                "content": f"<returncode>0</returncode>\n<output>\nstep {t}\n</output>",
            },
        ]
    meta = TrajectoryMetadata(
        task_id=instance_id, harness="mini", model="m", exit_status="step_limit", verdict=verify
    )
    return Trajectory(metadata=meta, messages=msgs)


def _write(path: Path, trajectories: list[Trajectory]) -> Path:
    path.write_text("".join(t.to_json() + "\n" for t in trajectories))
    return path


def _credit(*args: str) -> list[str]:
    return ["credit-sft", *args]


# ---------------------------------------------------------------- bad input


@pytest.mark.fast
def test_bad_input_is_reported_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "out.jsonl")
    missing = ["--estimator", "judge", "--trajectories", str(tmp_path / "nope.jsonl"), "--out", out]
    assert main(_credit(*missing)) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(_trajectory("a", 1).to_json() + "\n{not json\n")
    assert main(_credit("--estimator", "judge", "--trajectories", str(bad), "--out", out)) == 2
    assert f"{bad}:2: not JSON" in capsys.readouterr().err
    sample = tmp_path / "sample.jsonl"
    sample.write_text(json.dumps({"messages": [], "metadata": {"kind": "whole"}}) + "\n")
    assert main(_credit("--estimator", "judge", "--trajectories", str(sample), "--out", out)) == 2
    assert f"{sample}:1: not a trajectory" in capsys.readouterr().err
    good = str(_write(tmp_path / "t.jsonl", [_trajectory("a", 1)]))
    assert main(_credit("--estimator", "value", "--trajectories", good, "--out", out)) == 2
    assert "--value-model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(
            _credit("--estimator", "judge", "--trajectories", good, "--out", out, "--smooth", "x:1")
        )
    assert info.value.code == 2
    assert not Path(out).exists()


@pytest.mark.fast
def test_unreachable_services_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = str(_write(tmp_path / "t.jsonl", [_trajectory("a", 1)]))
    dead = f"http://127.0.0.1:{free_port()}"
    code = main(
        _credit(
            "--estimator",
            "judge",
            "--trajectories",
            good,
            "--out",
            str(tmp_path / "o.jsonl"),
            "--judge-url",
            f"{dead}/v1",
        )
    )
    assert code == 3 and "does not answer" in capsys.readouterr().err


@pytest.mark.integration
def test_mc_with_an_unknown_task_or_no_orchard_service(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ScriptedModelServer() as policy:
        common = [
            "--estimator",
            "mc",
            "--out",
            str(tmp_path / "o.jsonl"),
            "--policy-url",
            policy.base_url,
        ]
        unknown = str(_write(tmp_path / "u.jsonl", [_trajectory("nobody__nothing-1", 1)]))
        assert main(_credit(*common, "--trajectories", unknown)) == 2
        assert "unknown instance_id 'nobody__nothing-1'" in capsys.readouterr().err
        known = str(_write(tmp_path / "k.jsonl", [_trajectory(TASK_ID, 1)]))
        dead = f"http://127.0.0.1:{free_port()}"
        assert main(_credit(*common, "--trajectories", known, "--server-url", dead)) == 3
        assert f"the Orchard Env service at {dead}" in capsys.readouterr().err


# ---------------------------------------------------------------- judge, end to end


@attrs.define
class PrefixJudge(StubEndpoint):
    """A chat endpoint answering per (instance, prefix) from a table; prefixes come from the
    judge prompt's ``<attempt turns="N">``."""

    table: dict[str, list[str]]

    async def _chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        match = re.search(r'<attempt turns="(\d+)">', body["messages"][-1]["content"])
        assert match is not None
        answer = self.table[request.headers[INSTANCE_ID_HEADER]][int(match.group(1))]
        return JSONResponse(
            {
                "choices": [
                    {"message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
                ]
            }
        )

    async def _models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": []})

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/models", self._models),
        ]


def _sft_data(samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    tokens = tmp_path / "tokens.jsonl"
    code = main(
        [
            "sft-data",
            "--trajectories",
            str(samples),
            "--out",
            str(tokens),
            "--verify",
            "--no-dedupe",
        ]
    )
    assert code == 0
    stats: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert tokens.exists()
    return stats


@pytest.mark.integration
def test_judge_end_to_end_into_sft_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trajectories = [
        _trajectory("rises", 4),  # V: .1 .1 .7 .8 .2 -> one segment, turns [1, 3)
        _trajectory("flat", 2),  # V: .5 .5 .5 -> nothing
        _trajectory("solved", 2, verify="resolved"),  # kept whole, not judged
        _trajectory("empty", 0),  # no turn: nothing
    ]
    path = _write(tmp_path / "in.jsonl", trajectories)
    table = {"rises": ["0.1", "10%", "P=0.7", "0.8", "0.2"], "flat": ["0.5"] * 3}
    out, curves = tmp_path / "credit.jsonl", tmp_path / "curves.jsonl"
    with PrefixJudge(table) as judge:
        code = main(
            _credit(
                "--estimator",
                "judge",
                "--trajectories",
                str(path),
                "--out",
                str(out),
                "--judge-url",
                judge.base_url,
                "--delta",
                "0.5",
                "--curves",
                str(curves),
                "--json",
            )
        )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary | {"seconds": 0} == {
        "out": str(out),
        "estimator": "judge",
        "trajectories": 4,
        "resolved": 1,
        "estimated": 2,
        "without_turns": 1,
        "with_segments": 1,
        "samples": 2,
        "whole": 1,
        "segments": 1,
        "trained_turns": 4,
        "seconds": 0,
        "unparsed": 0,
    }
    records = [json.loads(line) for line in out.read_text().splitlines()]
    segment = next(r for r in records if r["metadata"]["kind"] == "segment")
    assert segment["metadata"]["turns"] == [1, 3] and segment["metadata"]["estimator"] == "judge"
    assert segment["metadata"]["values"] == [0.1, 0.1, 0.7, 0.8, 0.2]
    weights = [m.get("weight") for m in segment["messages"] if m["role"] == "assistant"]
    assert weights == [0, 1, 1]  # context turn 0, targets 1-2; turn 3 and later are cut
    assert [json.loads(line)["segments"] for line in curves.read_text().splitlines()] == [
        [[1, 3]],
        [],
    ]
    stats = _sft_data(out, tmp_path, capsys)
    assert stats["read"] == 2 and stats["kept"] == 2 and stats["verified"] == 2


# ---------------------------------------------------------------- Monte-Carlo, end to end


def _recording_script() -> list[Step]:
    (task,) = load_tasks(BUILTIN, ids=[TASK_ID])
    write, apply, submit = gold_script(task.patch, "tools").steps
    look = Step(content="Look.", tool_calls=(ToolCall("bash", {"command": "ls"}),))
    undo = Step(
        content="Undo.", tool_calls=(ToolCall("bash", {"command": "git checkout -q -- ."}),)
    )
    return [look, write, apply, undo, submit]


@pytest.mark.integration
def test_mc_end_to_end_from_distill_to_sft_data(
    server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """distill records (look, write the fix, apply it, undo it, submit: unresolved); MC
    replay with a submit-at-once policy finds V = 0 0 0 1 0 0: turn 2 applied the fix."""
    with ScriptedModelServer() as model:
        model.add(TASK_ID, _recording_script())
        assert (
            main(
                [
                    "distill",
                    "--harness",
                    "tools",
                    "--model",
                    "scripted",
                    "--base-url",
                    model.base_url,
                    "--tasks",
                    "builtin",
                    "--ids",
                    TASK_ID,
                    "--out",
                    str(tmp_path / "run"),
                    "--url",
                    server.url,
                ]
            )
            == 0
        )
    capsys.readouterr()
    out = tmp_path / "credit.jsonl"
    with ScriptedModelServer() as policy:
        policy.add(
            TASK_ID,
            Script([Step(content="Done.", tool_calls=(ToolCall("submit", {}),))], repeat_last=True),
        )
        code = main(
            _credit(
                "--estimator",
                "mc",
                "--trajectories",
                str(tmp_path / "run"),
                "--out",
                str(out),
                "--policy-url",
                policy.base_url,
                "--k",
                "1",
                "--server-url",
                server.url,
                "--delta",
                "0.5",
                "--json",
            )
        )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["estimated"] == 1 and summary["segments"] == 1 and summary["whole"] == 0
    assert summary["mc"] | {"sandbox_seconds": 0} == {
        "continuations": 5,
        "errors": 0,
        "resolved": 1,
        "restored_actions": 10,
        "diverged": 0,
        "sandbox_seconds": 0,
    }
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["metadata"]["turns"] == [2, 3]
    assert record["metadata"]["values"] == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    trained = [m for m in record["messages"] if m.get("weight") == 1]
    assert len(trained) == 1 and "git apply" in json.dumps(trained[0]["tool_calls"])
    stats = _sft_data(out, tmp_path, capsys)
    assert stats["kept"] == 1 and stats["verified"] == 1


# ---------------------------------------------------------------- value model, end to end


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_value_estimator_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 3-step random-tiny value model (``train-value``) drives ``credit-sft``; its worker
    process is stopped afterwards."""
    path = _write(
        tmp_path / "in.jsonl",
        [_trajectory("good", 2, verify="resolved"), _trajectory("bad", 3), _trajectory("worse", 1)],
    )
    model = tmp_path / "value"
    assert (
        main(["train-value", "--trajectories", str(path), "--out", str(model), "--steps", "3"]) == 0
    )
    capsys.readouterr()
    out = tmp_path / "credit.jsonl"
    code = main(
        _credit(
            "--estimator",
            "value",
            "--value-model",
            str(model),
            "--trajectories",
            str(path),
            "--out",
            str(out),
            "--curves",
            str(tmp_path / "c.jsonl"),
            "--json",
        )
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["estimated"] == 2 and summary["whole"] == 1
    curves = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert [len(c["values"]) for c in curves] == [4, 2]
    assert all(0.0 <= v <= 1.0 for c in curves for v in c["values"])
    missing = [
        "--estimator",
        "value",
        "--value-model",
        str(tmp_path / "nothing"),
        "--trajectories",
        str(path),
        "--out",
        str(out),
    ]
    assert main(_credit(*missing)) == 2

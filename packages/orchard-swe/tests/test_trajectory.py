"""The trajectory schema, its JSON-lines files and the mini-swe-agent converter (no processes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchard_env_client.llm import ModelConfig
from orchard_swe.testing.replay import (
    MINI_SUBMIT_COMMAND,
    Step,
    ToolCall,
    empty_script,
    from_trajectory,
    gold_script,
    junk_script,
)
from orchard_swe.trajectory import (
    SCHEMA,
    Trajectory,
    TrajectoryMetadata,
    append_jsonl,
    error_status,
    from_mini_traj,
    read_jsonl,
)

pytestmark = pytest.mark.fast


def _traj(instance_id: str = "repo__issue-1", **meta: Any) -> Trajectory:
    metadata = TrajectoryMetadata(
        task_id=instance_id,
        harness="tools",
        model="m",
        attempt=1,
        exit_status="submitted",
        steps=2,
        prompt_tokens=10,
        completion_tokens=5,
        cost=0.25,
        started_at=100.0,
        finished_at=101.5,
        duration_s=1.5,
        final_output="diff --git a/x b/x\n+caf\u00e9\n",
        extra={"nested": {"k": [1, 2]}},
        **meta,
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "fix it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    return Trajectory(metadata=metadata, messages=messages, tools=[{"type": "function"}])


def test_round_trip_through_dict_and_json() -> None:
    traj = _traj()
    data = traj.to_dict()
    assert data["schema"] == SCHEMA
    assert data["metadata"]["verdict"] is None and data["metadata"]["error"] is None
    assert Trajectory.from_dict(json.loads(json.dumps(data))) == traj
    assert Trajectory.from_json(traj.to_json()) == traj
    assert "\n" not in traj.to_json()
    with pytest.raises(ValueError, match="not an Orchard trajectory"):
        Trajectory.from_dict({"schema": "something-else", "metadata": {}})
    # metadata from a newer writer: unknown keys are ignored
    data["metadata"]["future_field"] = 1
    assert Trajectory.from_dict(data) == traj


def test_jsonl_append_and_read(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "trajs.jsonl"
    first, second = _traj("a"), _traj("b", verdict="passed")
    append_jsonl(path, first)
    append_jsonl(path, second)
    assert read_jsonl(path) == [first, second]
    assert path.read_bytes().count(b"\n") == 2


def test_a_torn_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    append_jsonl(path, _traj("a"))
    whole = _traj("b").to_json()
    with open(path, "a") as fh:
        fh.write(whole[: len(whole) // 2])  # a crash mid-write
    with pytest.warns(RuntimeWarning, match="torn"):
        assert [t.metadata.task_id for t in read_jsonl(path)] == ["a"]
    # the next append starts on a fresh line, so only the torn record is lost
    append_jsonl(path, _traj("c"))
    with pytest.warns(RuntimeWarning, match=":2: skipping"):
        assert [t.metadata.task_id for t in read_jsonl(path)] == ["a", "c"]
    with pytest.raises(ValueError, match="corrupt line"):
        read_jsonl(path, strict=True)


def test_error_status() -> None:
    assert error_status(RuntimeError("boom\n  bang")) == "error: RuntimeError: boom bang"
    assert error_status("x" * 1000).startswith("error: ")
    assert len(error_status("x" * 1000)) < 520


# ---------------------------------------------------------------- mini's .traj.json


def _mini_data(exit_status: str = "Submitted", **info: Any) -> dict[str, Any]:
    """A trajectory in the shape mini-swe-agent 2.4's ``DefaultAgent.save`` writes."""
    usage = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
    reply = "THOUGHT: look\n\n```mswea_bash_command\nls\n```"
    return {
        "info": {
            "model_stats": {"instance_cost": 0.5, "api_calls": 3},
            "config": {
                "agent": {"step_limit": 3, "cost_limit": 3.0},
                "model": {"model_name": "openai/qwen", "model_kwargs": {}},
                "model_type": "minisweagent.models.litellm_textbased_model.LitellmTextbasedModel",
                "environment": {"cwd": "/workspace/repo"},
                "environment_type": "orchard_swe.harness.mini.OrchardEnvironment",
            },
            "mini_version": "2.4.6",
            "exit_status": exit_status,
            "submission": "diff --git a/a b/a\n" if exit_status == "Submitted" else "",
            **info,
        },
        "messages": [
            {"role": "system", "content": "You are a helpful assistant"},
            {"role": "user", "content": "<pr_description>fix</pr_description>"},
            {
                "role": "assistant",
                "content": reply,
                "function_call": None,
                "provider_specific_fields": {},
                "extra": {
                    "actions": [{"command": "ls"}],
                    "response": {"usage": usage},
                    "cost": 0.25,
                    "timestamp": 1000.0,
                },
            },
            {
                "role": "user",
                "content": "<returncode>0</returncode>\n<output>\na\n</output>",
                "extra": {"raw_output": "a\n", "returncode": 0, "timestamp": 1001.0},
            },
            {
                "role": "user",
                "content": "Format error: found 0 actions",
                "extra": {
                    "interrupt_type": "FormatError",
                    "response": {"usage": usage},
                    "timestamp": 1002.0,
                },
            },
            {
                "role": "exit",
                "content": "",
                "extra": {"exit_status": exit_status, "submission": "", "timestamp": 1004.0},
            },
        ],
        "trajectory_format": "mini-swe-agent-1.1",
        "instance_id": "repo__issue-1",
    }


def test_from_mini_traj_converts_messages_and_metadata(tmp_path: Path) -> None:
    path = tmp_path / "x.traj.json"
    path.write_text(json.dumps(_mini_data()))
    traj = from_mini_traj(path, attempt=3)
    assert [m["role"] for m in traj.messages] == ["system", "user", "assistant", "user", "user"]
    assert traj.messages[2] == {
        "role": "assistant",
        "content": "THOUGHT: look\n\n```mswea_bash_command\nls\n```",
    }
    assert all("extra" not in m for m in traj.messages)
    assert traj.tools == []
    meta = traj.metadata
    assert (meta.task_id, meta.harness, meta.model, meta.attempt) == (
        "repo__issue-1",
        "mini",
        "openai/qwen",
        3,
    )
    assert meta.exit_status == "submitted" and meta.error is None
    assert (meta.steps, meta.cost) == (3, 0.5)
    assert (meta.prompt_tokens, meta.completion_tokens) == (200, 40)  # the reply + the junk one
    assert (meta.started_at, meta.finished_at, meta.duration_s) == (1000.0, 1004.0, 4.0)
    assert meta.final_output == "diff --git a/a b/a\n"
    assert meta.extra["mini"]["exit_status"] == "Submitted"
    # the same from the dict, with an instance id given
    assert from_mini_traj(_mini_data(), instance_id="other").metadata.task_id == "other"
    assert Trajectory.from_json(traj.to_json()) == traj


@pytest.mark.parametrize(
    ("raw", "info", "expected"),
    [
        ("LimitsExceeded", {}, "step_limit"),
        ("LimitsExceeded", {"model_stats": {"instance_cost": 3.5, "api_calls": 1}}, "cost_limit"),
        ("TimeExceeded", {}, "time_limit"),
        ("RepeatedFormatError", {}, "format_error"),
        ("APIError", {"exception_str": "server down"}, "error: APIError: server down"),
    ],
)
def test_from_mini_traj_maps_exit_statuses(raw: str, info: dict[str, Any], expected: str) -> None:
    traj = from_mini_traj(_mini_data(raw, **info))
    assert traj.metadata.exit_status == expected
    assert (traj.metadata.error is not None) == expected.startswith("error")


def test_from_mini_traj_tool_calling_models() -> None:
    data = _mini_data()
    data["info"]["config"]["model_type"] = "minisweagent.models.litellm_model.LitellmModel"
    data["messages"][2]["tool_calls"] = [
        {
            "id": "t1",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command":"ls"}'},
        }
    ]
    data["messages"][3] |= {"role": "tool", "tool_call_id": "t1"}
    traj = from_mini_traj(data)
    assert traj.tools[0]["function"]["name"] == "bash"
    assert traj.messages[2]["tool_calls"][0]["function"]["arguments"] == '{"command":"ls"}'
    assert traj.messages[3]["role"] == "tool" and traj.messages[3]["tool_call_id"] == "t1"


# ---------------------------------------------------------------- scripts and config


def test_script_builders() -> None:
    patch = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"
    tools = gold_script(patch, "tools")
    assert [s.tool_calls[0].name for s in tools.steps] == ["bash", "bash", "submit"]
    command = tools.steps[0].tool_calls[0].arguments["command"]  # type: ignore[index]
    assert (
        command == f"cat > /tmp/orchard_gold.patch <<'ORCHARD_PATCH_EOF'\n{patch}ORCHARD_PATCH_EOF"
    )
    mini = gold_script(patch, "mini")
    assert all(not s.tool_calls for s in mini.steps)
    assert mini.steps[1].content.endswith(
        "```mswea_bash_command\ngit apply /tmp/orchard_gold.patch\n```"
    )
    assert MINI_SUBMIT_COMMAND in mini.steps[2].content
    # a patch containing the heredoc marker or a code fence is still carried intact
    steps = gold_script("ORCHARD_PATCH_EOF\n", "tools").steps
    command = steps[0].tool_calls[0].arguments["command"]  # type: ignore[index]
    assert command.startswith("cat > /tmp/orchard_gold.patch <<'ORCHARD_PATCH_EOF_X'\n")
    steps = gold_script("+```\n", "mini").steps
    assert "```mswea_bash_command\nbase64 -d > /tmp/orchard_gold.patch <<'" in steps[0].content
    assert steps[0].content.count("```") == 2
    assert [s.tool_calls[0].name for s in empty_script("tools").steps] == ["submit"]
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in empty_script("mini").steps[0].content
    junk = junk_script()
    assert junk.step(0) == junk.step(99) and not junk.step(5).tool_calls  # type: ignore[union-attr]
    assert gold_script(patch, "tools").step(3) is None
    with pytest.raises(ValueError, match="unknown harness"):
        gold_script(patch, "swe-agent")  # type: ignore[arg-type]
    assert Step.coerce({"tool": "submit"}) == Step(tool_calls=(ToolCall("submit", {}),))
    assert Step.coerce("hi") == Step(content="hi")


def test_from_trajectory_replays_assistant_turns() -> None:
    script = from_trajectory(_traj())
    assert script.steps == [Step(content="", tool_calls=(ToolCall("bash", "{}"),))]


def test_model_config() -> None:
    config = ModelConfig(
        model="m",
        base_url="http://127.0.0.1:1/v1",
        price_per_1k_prompt=1.0,
        price_per_1k_completion=4.0,
    )
    assert config.cost(1000, 500) == 3.0
    assert ModelConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert (
        ModelConfig(model="m", base_url="x", api_key_env="ORCHARD_SWE_UNSET_VAR").api_key() is None
    )

"""Per-step SFT conversion: one example per action, the screenshot BEFORE it, formats,
filters and image references."""

from __future__ import annotations

import base64
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from orchard_env_client.trajectory import artifact_path, inline_artifacts
from orchard_gui.harness import HarnessConfig, system_prompt
from orchard_gui.sft import SFTConfig, step_examples, write_sft, write_sft_file

sys.path.insert(0, str(Path(__file__).parent))
from gui_runs import make_run, make_trajectory

pytestmark = pytest.mark.fast


def image_bytes(example: dict) -> bytes:
    (part,) = [p for p in example["messages"][1]["content"] if p["type"] == "image_url"]
    url = part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    return base64.b64decode(url.split(",", 1)[1])


def user_text(example: dict) -> str:
    return example["messages"][1]["content"][0]["text"]


def test_one_example_per_action_with_the_screenshot_before(tmp_path: Path) -> None:
    traj = make_trajectory(tmp_path, reward=1.0)
    examples = step_examples(traj, tmp_path)
    # 4 browser actions + the final done, each with the screenshot of the step before it
    assert [e["meta"]["step"] for e in examples] == [1, 2, 3, 4, 5]
    for example in examples:
        step = example["meta"]["step"]
        before = traj.steps[step - 1].artifacts["screenshot"]
        assert image_bytes(example) == artifact_path(tmp_path, before).read_bytes()
        assert [m["role"] for m in example["messages"]] == ["system", "user", "assistant"]
        assert example["messages"][0]["content"] == "You are a web agent (tools format)."
        assert example["tools"] == traj.tools
        assert example["meta"] == {
            "task_id": "shop-1",
            "step": step,
            "attempt": 0,
            "reward": 1.0,
            "verdict": "success",
            "model": "agent-model",
        }
    click = examples[0]["messages"][2]
    assert click["content"] == "Thought 1: doing click."
    (call,) = click["tool_calls"]
    assert call["function"]["name"] == "click"
    assert json.loads(call["function"]["arguments"]) == {"x": 100, "y": 50}
    done = examples[-1]["messages"][2]["tool_calls"][0]["function"]
    assert (done["name"], json.loads(done["arguments"])) == ("done", {"answer": "$42"})


def test_user_message_history_and_page_text(tmp_path: Path) -> None:
    traj = make_trajectory(tmp_path)
    example = step_examples(traj, tmp_path, SFTConfig(history=1))[2]  # step 3
    text = user_text(example)
    assert text.startswith("Task: Find blue shoes under $50")
    history = text.split("Previous actions:\n", 1)[1].split("\n\n", 1)[0]
    assert history.startswith("2. type(") and "1. click" not in history
    assert "URL: http://127.0.0.1:8000/page2" in text and '"Search 2"' in text
    assert "Done:" not in text
    first = user_text(step_examples(traj, tmp_path, SFTConfig(marks=False))[0])
    assert "Previous actions:\n(no actions)" in first
    assert "URL: http://127.0.0.1:8000/page0" in first and "Search" not in first


def test_failed_actions_and_missing_files_are_counted(tmp_path: Path) -> None:
    traj = make_trajectory(tmp_path, errors={2: "element not found"})
    skipped: Counter[str] = Counter()
    assert [e["meta"]["step"] for e in step_examples(traj, tmp_path, None, skipped)] == [
        1,
        3,
        4,
        5,
    ]
    assert skipped == {"failed action": 1}
    kept = step_examples(traj, tmp_path, SFTConfig(skip_failed_actions=False))
    assert len(kept) == 5 and "[failed: element not found]" in user_text(kept[2])
    (tmp_path / traj.steps[0].artifacts["screenshot"].path).unlink()
    skipped.clear()
    assert len(step_examples(traj, tmp_path, SFTConfig(skip_failed_actions=False), skipped)) == 4
    assert skipped == {"missing screenshot file": 1}


def test_text_format_and_conversions(tmp_path: Path) -> None:
    text_traj = make_trajectory(tmp_path, fmt="text", task_id="t")
    (first, *_) = examples = step_examples(text_traj, tmp_path)
    assert all("tools" not in e for e in examples)
    assert first["messages"][2] == {
        "role": "assistant",
        "content": "Thought 1: doing click.\nAction: click(100, 50)",
    }
    as_tools = step_examples(text_traj, tmp_path, SFTConfig(action_format="tools"))[0]
    assert as_tools["messages"][2]["content"] == "Thought 1: doing click."
    assert as_tools["messages"][2]["tool_calls"][0]["function"]["name"] == "click"
    assert {t["function"]["name"] for t in as_tools["tools"]} >= {"click", "type", "done"}
    packaged = system_prompt(HarnessConfig(action_format="tools"), (1280, 720))
    assert as_tools["messages"][0]["content"] == packaged

    tools_traj = make_trajectory(tmp_path, task_id="u")
    as_text = step_examples(tools_traj, tmp_path, SFTConfig(action_format="text"))[0]
    assert as_text["messages"][2]["content"] == "Thought 1: doing click.\nAction: click(100, 50)"
    assert "Action:" in as_text["messages"][0]["content"]  # the packaged text-format prompt
    bare = step_examples(tools_traj, tmp_path, SFTConfig(action_format="text", keep_thoughts=False))
    assert bare[0]["messages"][2]["content"] == "Action: click(100, 50)"


def test_artifact_references(tmp_path: Path) -> None:
    traj = make_trajectory(tmp_path)
    example = step_examples(traj, tmp_path, SFTConfig(inline_images=False))[1]
    url = example["messages"][1]["content"][1]["image_url"]["url"]
    assert url == "artifact:artifacts/shop-1/0/step-001.png"
    root = example["meta"]["artifact_root"]
    assert root == str(tmp_path.resolve())
    inlined = inline_artifacts(example["messages"], root)
    assert image_bytes({"messages": inlined}) == (tmp_path / url.split(":", 1)[1]).read_bytes()


def test_write_sft_filters_by_reward(tmp_path: Path) -> None:
    run = make_run(
        tmp_path,
        [
            {"task_id": "good", "reward": 1.0},
            {"task_id": "bad", "reward": 0.0},
            {"task_id": "ungraded"},
        ],
    )
    out = tmp_path / "sft" / "train.jsonl"
    summary = write_sft(run, out, SFTConfig(min_reward=1.0))
    assert (summary.trajectories, summary.used, summary.examples) == (3, 1, 5)
    assert summary.skipped == {"reward filter (trajectories)": 2}
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5 and {r["meta"]["task_id"] for r in rows} == {"good"}
    everything = write_sft([run], out)
    assert (everything.used, everything.examples) == (3, 15)
    assert len(out.read_text().splitlines()) == 15
    with pytest.raises(ValueError, match="input"):
        write_sft(run, run)


def test_write_sft_file_takes_options(tmp_path: Path) -> None:
    run = make_run(tmp_path, [{"task_id": "good", "reward": 1.0}, {"task_id": "bad"}])
    summary = write_sft_file(run, tmp_path / "out.jsonl", min_reward=1.0, inline_images=False)
    assert (summary.used, summary.examples) == (1, 5)
    row = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])
    assert row["messages"][1]["content"][1]["image_url"]["url"].startswith("artifact:")

"""The recipe-neutral trajectory record: steps, artifacts, token ids, older files."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from orchard_env_client.trajectory import (
    SCHEMA,
    Artifact,
    ArtifactWriter,
    Trajectory,
    TrajectoryMetadata,
    TrajectoryStep,
    TurnTokens,
    append_jsonl,
    artifact_path,
    artifact_url,
    inline_artifacts,
    read_jsonl,
)

pytestmark = pytest.mark.fast

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def _gui_trajectory(tmp_path: Path) -> Trajectory:
    writer = ArtifactWriter(tmp_path, "artifacts/t1/0")
    shot = writer.write("step-000.png", PNG)
    return Trajectory(
        metadata=TrajectoryMetadata(task_id="t1", recipe="gui", harness="react", reward=1.0),
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "click ok"},
                    {"type": "image_url", "image_url": {"url": artifact_url(shot)}},
                ],
            },
            {"role": "assistant", "content": "click(10, 20)"},
        ],
        steps=[
            TrajectoryStep(
                index=0, observation={"url": "http://x/"}, artifacts={"screenshot": shot}
            ),
            TrajectoryStep(index=1, action={"action": "click", "x": 10, "y": 20}, message_index=1),
        ],
        token_ids=[TurnTokens(message_index=1, prompt_ids=[1, 2], completion_ids=[3])],
    )


def test_a_gui_trajectory_round_trips_with_its_steps_artifacts_and_tokens(tmp_path: Path) -> None:
    traj = _gui_trajectory(tmp_path)
    data = json.loads(traj.to_json())
    assert data["schema"] == SCHEMA
    assert Trajectory.from_dict(data) == traj
    path = tmp_path / "run.jsonl"
    append_jsonl(path, traj)
    assert read_jsonl(path) == [traj]
    shot = traj.steps[0].artifacts["screenshot"]
    assert shot.path == "artifacts/t1/0/step-000.png"
    assert shot.sha256 == hashlib.sha256(PNG).hexdigest() and shot.size == len(PNG)
    assert artifact_path(tmp_path, shot).read_bytes() == PNG


def test_inline_artifacts_gives_data_urls_and_names_a_missing_file(tmp_path: Path) -> None:
    traj = _gui_trajectory(tmp_path)
    inlined = inline_artifacts(traj.messages, tmp_path)
    url = inlined[0]["content"][1]["image_url"]["url"]
    assert url == "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert traj.messages[0]["content"][1]["image_url"]["url"].startswith("artifact:")  # a copy
    (tmp_path / "artifacts/t1/0/step-000.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"step-000\.png"):
        inline_artifacts(traj.messages, tmp_path)


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x.png", "a/../../x.png", ""])
def test_artifact_paths_stay_inside_the_run_directory(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="relative"):
        artifact_path(tmp_path, Artifact(path=bad))
    with pytest.raises(ValueError, match="relative"):
        ArtifactWriter(tmp_path, "artifacts").write(bad, b"x")


def test_an_orchard_swe_trajectory_v1_file_loads_into_the_current_form(tmp_path: Path) -> None:
    old = {
        "schema": "orchard-swe-trajectory/1",
        "metadata": {
            "instance_id": "repo__issue-1",
            "harness": "tools",
            "model": "m",
            "exit_status": "submitted",
            "final_patch": "diff --git a/x b/x\n",
            "verify_status": "resolved",
            "extra": {"k": 1},
        },
        "messages": [{"role": "user", "content": "fix"}],
        "tools": [],
    }
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n")
    (traj,) = read_jsonl(path)
    meta = traj.metadata
    assert (meta.task_id, meta.recipe, meta.final_output, meta.verdict) == (
        "repo__issue-1",
        "swe",
        "diff --git a/x b/x\n",
        "resolved",
    )
    assert traj.steps == [] and traj.token_ids == [] and meta.extra == {"k": 1}
    assert Trajectory.from_json(traj.to_json()) == traj  # written back in the current schema


def test_unknown_and_newer_schemas_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="not an Orchard trajectory"):
        Trajectory.from_dict({"schema": "something-else/1", "metadata": {"task_id": "x"}})
    with pytest.raises(ValueError, match="newer than this reader"):
        Trajectory.from_dict({"schema": "orchard-trajectory/99", "metadata": {"task_id": "x"}})

"""The distillation runner end to end: a harness, a scripted model, real sandboxes, grading,
the JSONL and its resumption."""

from __future__ import annotations

import json

import pytest

from orchard_env_client.llm import ModelConfig
from orchard_swe.distill import TRAJECTORIES, DistillConfig, distill, finished_attempts
from orchard_swe.testing.replay import ScriptedModelServer, empty_script, gold_script
from orchard_swe.trajectory import read_jsonl

pytestmark = pytest.mark.integration


def _config(server, out, harness="tools", attempts=2):
    model = ModelConfig(model="scripted", base_url=server.base_url)
    return DistillConfig(harness=harness, model=model, out_dir=out, attempts=attempts)


@pytest.mark.parametrize("harness", ["tools", "mini"])
async def test_gold_resolves_and_a_rerun_skips_what_is_done(client, calc_task, tmp_path, harness):
    with ScriptedModelServer() as model:
        model.add(calc_task.instance_id, gold_script(calc_task.patch, harness))
        summary = await distill(client, [calc_task], _config(model, tmp_path, harness))
        assert summary["attempts"] == 2 and summary["resolved_rate"] == 1.0, summary
        trajectories = read_jsonl(tmp_path / TRAJECTORIES)
        assert {t.metadata.attempt for t in trajectories} == {0, 1}
        meta = trajectories[0].metadata
        assert meta.verdict == "resolved" and meta.harness == harness
        assert meta.exit_status == "submitted" and meta.steps >= 2 and meta.prompt_tokens > 0
        assert meta.extra["grading"]["status"] == "resolved"
        again = await distill(client, [calc_task], _config(model, tmp_path, harness))
    assert again["resumed_from_earlier_run"] == 2 and again["attempts"] == 2
    assert len((tmp_path / TRAJECTORIES).read_text().splitlines()) == 2  # nothing rerun
    assert json.loads((tmp_path / "summary.json").read_text())["resolved"] == 2


async def test_a_torn_last_line_is_rerun_after_a_crash(client, calc_task, tmp_path):
    with ScriptedModelServer() as model:
        model.add(calc_task.instance_id, empty_script("tools"))
        await distill(client, [calc_task], _config(model, tmp_path))
        path = tmp_path / TRAJECTORIES
        lines = path.read_text().splitlines(keepends=True)
        path.write_text(lines[0] + lines[1][: len(lines[1]) // 2])  # killed mid-write
        assert len(finished_attempts(tmp_path)) == 1
        summary = await distill(client, [calc_task], _config(model, tmp_path))
    assert summary["attempts"] == 2 and summary["resolved"] == 0
    assert summary["verify_status"] == {"unresolved": 2}


async def test_an_unreachable_model_is_recorded_not_lost(client, calc_task, tmp_path):
    dead = ModelConfig(model="x", base_url="http://127.0.0.1:9/v1", max_retries=0)
    config = DistillConfig(harness="tools", model=dead, out_dir=tmp_path, attempts=1)
    summary = await distill(client, [calc_task], config)
    assert summary["attempts"] == 1 and summary["resolved"] == 0
    meta = read_jsonl(tmp_path / TRAJECTORIES)[0].metadata
    assert meta.exit_status.startswith("error") or meta.error, meta

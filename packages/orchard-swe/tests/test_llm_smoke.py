"""Protocol smoke test with a real small model: both harnesses run their loop against
SmolLM2-135M on a built-in task, and the trajectory and grading complete. Whether the model
solves anything is not asserted: it is a 135M model."""

from __future__ import annotations

import pytest

from orchard_env_client.llm import ModelConfig
from orchard_swe.distill import TRAJECTORIES, DistillConfig, distill
from orchard_swe.grading import STATUSES
from orchard_swe.tasks import load_tasks
from orchard_swe.trajectory import read_jsonl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]


@pytest.mark.parametrize("server", ["local"], indirect=True)  # one backend is enough here
@pytest.mark.parametrize("harness", ["tools", "mini"])
async def test_a_real_model_drives_each_harness_to_a_graded_trajectory(
    client, server, tiny_llm, tmp_path, harness
):
    task = load_tasks("builtin")[0]
    model = ModelConfig(model="smollm2-135m", base_url=tiny_llm, max_tokens=48, max_retries=1)
    config = DistillConfig(harness=harness, model=model, out_dir=tmp_path, max_steps=2)
    summary = await distill(client, [task], config)
    assert summary["attempts"] == 1
    meta = read_jsonl(tmp_path / TRAJECTORIES)[0]
    assert meta.metadata.verdict in STATUSES
    assert meta.metadata.prompt_tokens > 0 and meta.metadata.completion_tokens > 0
    assert meta.metadata.steps >= 1 and meta.metadata.error is None, meta.metadata
    assert meta.metadata.exit_status  # submitted, step_limit or format_error: the loop ended
    # mini keeps only its format-error feedback for replies it cannot parse, not the replies.
    roles = {m["role"] for m in meta.messages}
    assert "assistant" in roles if harness == "tools" else len(meta.messages) >= 3, meta.messages

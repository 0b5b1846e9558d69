"""The paper's claim, end to end: one scripted model drives our harness and the foreign ones
(openclaw, codex, opencode run inside network-blocked sandboxes, reaching the model through a
service bridge and the recording proxy); the same checkers grade them and every run's
trajectories load with the one reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard_claw.foreign import HARNESS_IMAGE, HARNESSES
from orchard_claw.foreign_runner import recording_proxy
from orchard_claw.harness import HARNESS_NAME
from orchard_claw.images import harnesses_rootfs
from orchard_claw.runner import EvalConfig, evaluate
from orchard_claw.scripted import DONE_TEXT, reference_responder
from orchard_claw.tasks import ClawTask, builtin_tasks
from orchard_env_client import AsyncSandboxClient
from orchard_env_client.llm import ModelConfig
from orchard_env_client.recording_proxy import read_exchanges
from orchard_env_client.testing import ScriptedModelServer
from orchard_env_client.trajectory import read_jsonl
from orchard_testing import RunningServer, docker

pytestmark = pytest.mark.integration

# a file task and a task with a service (the foreign harness calls it with curl or python3)
TASKS: list[ClawTask] = [
    next(t for t in builtin_tasks() if t.kind == "file_organisation"),
    next(t for t in builtin_tasks() if t.service is not None),
]


def _image(server: RunningServer) -> str:
    if server.backend == "local":
        root = harnesses_rootfs()
        if not Path(root).is_dir():
            raise RuntimeError(f"{root} is missing: run infra/images/build --only harnesses")
        return root
    docker("image", "inspect", "--format", "{{.Id}}", HARNESS_IMAGE)
    return HARNESS_IMAGE


@pytest.mark.parametrize("harness", [HARNESS_NAME, *sorted(HARNESSES)])
async def test_one_model_under_every_harness(
    claw_server: RunningServer, tmp_path: Path, harness: str
) -> None:
    with ScriptedModelServer() as llm:
        llm.set_default(reference_responder(TASKS))
        model = ModelConfig(model="scripted", base_url=llm.base_url, max_retries=0)
        config = EvalConfig(
            out_dir=tmp_path,
            model=model,
            image=_image(claw_server),
            harness=harness,
            trials=1,
            concurrency=2,
            foreign_timeout_s=240,
        )
        async with AsyncSandboxClient(claw_server.url) as client:
            if harness == HARNESS_NAME:
                summary = await evaluate(client, TASKS, config)
            else:
                with recording_proxy(llm.base_url, tmp_path) as proxy:
                    summary = await evaluate(client, TASKS, config, proxy=proxy)
    trajectories = read_jsonl(tmp_path / "trajectories.jsonl", strict=True)
    problems = {
        t.metadata.task_id: (
            t.metadata.exit_status,
            t.metadata.error,
            t.metadata.extra.get("check"),
            t.metadata.extra.get("stderr_tail"),
        )
        for t in trajectories
        if t.metadata.reward != 1.0
    }
    assert not problems and summary["errors"] == 0
    for traj in trajectories:
        meta = traj.metadata
        assert (meta.recipe, meta.harness, meta.exit_status) == ("claw", harness, "submitted")
        assert DONE_TEXT in meta.final_output
        assert meta.steps >= 2 and meta.prompt_tokens > 0
        assert traj.messages and traj.messages[-1]["role"] == "assistant"
        assert any(m.get("tool_calls") for m in traj.messages if m["role"] == "assistant")
    if harness != HARNESS_NAME:
        exchanges = read_exchanges(tmp_path / "exchanges.jsonl")
        runs = {str(t.metadata.extra["run_id"]) for t in trajectories}
        assert runs == {e.run_id for e in exchanges}  # every call came through the proxy
        assert all(e.error is None and e.status == 200 for e in exchanges)

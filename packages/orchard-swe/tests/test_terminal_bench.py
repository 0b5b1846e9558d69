"""Terminal-Bench-format tasks (packages/orchard-harbor/tasks) loaded as our SWE ``Task``,
and one run through the client in a real sandbox: the verifier fails before the oracle
solution and passes after it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from orchard_env_client import AsyncSandbox, AsyncSandboxClient
from orchard_env_client.llm import ModelConfig
from orchard_env_client.testing import Script, ScriptedModelServer, Step, ToolCall
from orchard_swe.cli import main
from orchard_swe.distill import TRAJECTORIES
from orchard_swe.harness.tools import run_tools_agent
from orchard_swe.tasks import TaskLoadError
from orchard_swe.terminal_bench import (
    REPO_PREFIX,
    TerminalBenchSpec,
    load_task,
    load_tasks,
    prepare,
    run_attempt,
    run_oracle,
    run_verifier,
)
from orchard_swe.trajectory import Trajectory, read_jsonl
from orchard_testing import IMAGES, RunningServer, import_into_test_store

TASKS = Path(__file__).resolve().parents[2] / "orchard-harbor" / "tasks"


@pytest.mark.fast
def test_loads_every_task() -> None:
    tasks = load_tasks(TASKS)
    assert len(tasks) >= 5
    for task in tasks:
        spec = TerminalBenchSpec.of(task)
        assert task.repo == REPO_PREFIX + task.instance_id
        assert task.problem_statement == spec.instruction
        assert task.image_name == spec.docker_image == "orchard-test/debian"
        assert task.extra["has_oracle"]
        assert spec.verifier_timeout_sec == 60.0
    words = TerminalBenchSpec.of(load_task(TASKS / "word-count"))
    assert words.environment_files == ("words.txt",)


@pytest.mark.fast
def test_bad_task_dirs_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match=r"missing task\.toml"):
        load_task(tmp_path)
    (tmp_path / "task.toml").write_text("[environment]\n")
    (tmp_path / "instruction.md").write_text("do it")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test.sh").write_text("true")
    with pytest.raises(TaskLoadError, match=r"no \[environment\]\.docker_image"):
        load_task(tmp_path)
    with pytest.raises(TaskLoadError, match=r"no task\.toml"):
        load_tasks(tmp_path / "tests")


@pytest.mark.integration
@pytest.mark.parametrize("name", ["word-count", "git-repo"])
async def test_oracle_passes_in_a_sandbox(server: RunningServer, name: str) -> None:
    task = load_task(TASKS / name)
    assert task.image_name == IMAGES["docker"]
    if server.backend == "local":
        import_into_test_store(task.image_name)
    async with AsyncSandboxClient(server.url) as client:
        sandbox = await client.create_sandbox(task.image_name, block_network=True)
        workdir = await prepare(sandbox, task)
        assert workdir.startswith("/")
        assert await run_verifier(sandbox, task) == 0.0  # nothing done yet
        exit_code, output = await run_oracle(sandbox, task)
        assert exit_code == 0, output
        assert await run_verifier(sandbox, task) == 1.0


FORGED = "echo 1 > /logs/verifier/reward.txt"  # the verifier must not take this
HELLO = "mkdir -p /app && printf 'Hello, Orchard!\\n' > /app/hello.txt"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("commands", "verdict"),
    [([HELLO], "resolved"), (["ls"], "unresolved"), ([FORGED], "unresolved")],
    ids=["solves", "fails", "forges-a-reward"],
)
async def test_our_tools_harness_runs_a_terminal_bench_task(
    server: RunningServer, commands: list[str], verdict: str
) -> None:
    """The tools harness, driven by a scripted model, on a Terminal-Bench task; the task's
    own verifier decides."""
    task = load_task(TASKS / "hello-file")
    if server.backend == "local":
        import_into_test_store(task.image_name or "")
    steps = [Step(tool_calls=(ToolCall("bash", {"command": c}),)) for c in commands]
    script = Script([*steps, Step(tool_calls=(ToolCall("submit", {}),))])
    with ScriptedModelServer() as model_server:
        model_server.add(f"tb-{verdict}", script)
        model = ModelConfig(
            model="scripted",
            base_url=model_server.base_url,
            api_key_env="ORCHARD_SWE_TEST_NO_KEY",
            max_retries=0,
        )

        async def run(sandbox: AsyncSandbox, workdir: str) -> Trajectory:
            return await run_tools_agent(
                sandbox,
                task.problem_statement,
                model=model,
                instance_id=f"tb-{verdict}",
                repo_dir=workdir,
            )

        async with AsyncSandboxClient(server.url) as client:
            traj = await run_attempt(client, task, run, harness="tools", model="scripted")
    meta = traj.metadata
    assert meta.exit_status == "submitted" and meta.error is None, meta.error
    assert meta.verdict == verdict
    assert meta.extra["terminal_bench"]["reward"] == (1.0 if verdict == "resolved" else 0.0)


def _write_task(root: Path, task_toml: str, test_sh: str) -> Path:
    task = root / "env-task"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text(task_toml)
    (task / "instruction.md").write_text("Nothing to do.\n")
    (task / "tests" / "test.sh").write_text(test_sh)
    return task


@pytest.mark.integration
async def test_the_tasks_env_workdir_and_agent_timeout_apply(
    server: RunningServer, tmp_path: Path
) -> None:
    """``[environment] env`` and ``workdir`` hold for the harness's commands; a harness
    running past ``[agent] timeout_sec`` is cut off, recorded as ``time_limit``, and the
    verifier still judges what it left."""
    task_dir = _write_task(
        tmp_path,
        f'[environment]\ndocker_image = "{IMAGES["docker"]}"\nworkdir = "/srv"\n'
        '[environment.env]\nGREETING = "hi"\n[agent]\ntimeout_sec = 3.0\n'
        "[verifier]\ntimeout_sec = 30.0\n",
        '#!/bin/bash\n[ "$(cat /srv/seen.txt)" = "hi /srv" ] && echo 1 > /logs/verifier/reward.txt'
        " || echo 0 > /logs/verifier/reward.txt\n",
    )
    task = load_task(task_dir)
    if server.backend == "local":
        import_into_test_store(task.image_name or "")

    async def run(sandbox: AsyncSandbox, workdir: str) -> Trajectory:
        assert workdir == "/srv"
        job = await sandbox.exec('echo "$GREETING $PWD" > seen.txt', timeout=30)
        assert job.exit_code == 0, job.stderr
        await asyncio.sleep(600)  # a harness that would run on and on
        raise AssertionError("not cut off")

    started = time.monotonic()
    async with AsyncSandboxClient(server.url) as client:
        traj = await run_attempt(client, task, run, harness="tools", model="none")
    assert time.monotonic() - started < 120
    meta = traj.metadata
    assert meta.exit_status == "time_limit" and "timeout_sec (3 s)" in (meta.error or "")
    assert meta.verdict == "resolved", meta.extra


@pytest.mark.integration
def test_distill_runs_terminal_bench_tasks(
    server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``orchard-swe distill --tasks DIR`` takes Terminal-Bench task directories: each
    attempt is verified by the task's own tests (hello-file solved, word-count not)."""
    if server.backend == "local":
        import_into_test_store(IMAGES["docker"])
    bash = [Step(tool_calls=(ToolCall("bash", {"command": HELLO}),))]
    submit = [Step(tool_calls=(ToolCall("submit", {}),))]
    with ScriptedModelServer() as model:
        model.add("hello-file", Script([*bash, *submit]))
        model.add("word-count", Script(submit))
        code = main(
            [
                "distill",
                "--harness",
                "tools",
                "--model",
                "scripted",
                "--base-url",
                model.base_url,
                "--tasks",
                str(TASKS),
                "--ids",
                "hello-file",
                "word-count",
                "--out",
                str(tmp_path / "run"),
                "--url",
                server.url,
            ]
        )
    assert code == 0
    verdicts = {
        t.metadata.task_id: t.metadata.verdict for t in read_jsonl(tmp_path / "run" / TRAJECTORIES)
    }
    assert verdicts == {"hello-file": "resolved", "word-count": "unresolved"}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["resolved"] == 1 and summary["attempts"] == 2
    capsys.readouterr()
    assert (
        main(
            [
                "distill",
                "--harness",
                "tools",
                "--model",
                "m",
                "--tasks",
                str(TASKS),
                "--ids",
                "nope",
                "--out",
                str(tmp_path / "x"),
                "--url",
                server.url,
            ]
        )
        == 2
    )
    assert "unknown instance_id 'nope'" in capsys.readouterr().err

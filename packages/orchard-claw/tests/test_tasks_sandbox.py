"""Every task in a real sandbox: a do-nothing run fails its checker, the reference passes."""

from __future__ import annotations

from typing import Any

import pytest

from orchard_claw.tasks import (
    ClawTask,
    builtin_tasks,
    check,
    generate,
    prepare,
    run_reference,
    template_names,
)
from orchard_env_client import AsyncSandboxClient

pytestmark = pytest.mark.integration

BUILTIN = builtin_tasks()
GENERATED = [generate(name, seed) for name in template_names() for seed in (3, 2024)]


async def _do_nothing_fails_reference_passes(shared: Any, task: ClawTask) -> None:
    async with AsyncSandboxClient(shared.url) as client:
        sandbox = await client.get_sandbox(shared.sandbox_id)
        await prepare(sandbox, task)
        idle = await check(sandbox, task)
        assert not idle.passed, f"{task.id}: a do-nothing run passed: {idle.details}"
        assert idle.score < 1.0
        await run_reference(sandbox, task)
        done = await check(sandbox, task)
        failed = [d for d in done.details if not d.startswith("ok")]
        assert done.passed and done.score == 1.0, f"{task.id}: reference rejected: {failed}"


@pytest.mark.parametrize("task", BUILTIN, ids=lambda t: t.id)
async def test_builtin_task_rejects_idle_accepts_reference(
    claw_sandbox: Any, task: ClawTask
) -> None:
    await _do_nothing_fails_reference_passes(claw_sandbox, task)


@pytest.mark.parametrize("task", GENERATED, ids=lambda t: t.id)
async def test_generated_task_rejects_idle_accepts_reference(
    claw_sandbox: Any, task: ClawTask
) -> None:
    await _do_nothing_fails_reference_passes(claw_sandbox, task)

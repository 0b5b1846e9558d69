"""RL rollouts of the browser agent: fresh sandboxes, programmatic rewards, one record.

``await rollout_group(client, task, model, n)`` runs ``n`` episodes of one task, each in a
sandbox of its own (concurrently, up to ``concurrency``), and returns their
:class:`~orchard_env_client.trajectory.Trajectory` records: the same contract as every
other recipe's, with ``metadata.reward`` from the task's checker (offline tasks) and the
episode's status under the Balanced Adaptive Rollout's names in
``metadata.extra["rollout_status"]`` (:func:`rollout_status`), so a trainer can group,
filter and advantage-weight GUI rollouts exactly as it does SWE ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from orchard_env_client import AsyncSandboxClient
from orchard_env_client.llm import ModelConfig
from orchard_env_client.trajectory import STEP_LIMIT, TIME_LIMIT, Trajectory

from .harness import HarnessConfig, run_episode
from .runner import browser_sandbox, default_image, error_trajectory
from .tasks import WebTask

__all__ = ["COMPLETED", "rollout", "rollout_group", "rollout_status"]

COMPLETED: Final = "completed"
TRUNCATED: Final = "truncated"
TIME_EXCEEDED: Final = "time_exceeded"
ABORTED: Final = "aborted"


def rollout_status(traj: Trajectory) -> str:
    """The episode's status in BAR's terms: ``completed`` (the agent finished, whatever
    the reward), ``truncated`` (step limit or repeated format errors), ``time_exceeded``
    or ``aborted`` (an environment or model error)."""
    status = traj.metadata.exit_status
    if status == TIME_LIMIT:
        return TIME_EXCEEDED
    if status.startswith("error"):
        return ABORTED
    if status in (STEP_LIMIT, "format_error"):
        return TRUNCATED
    return COMPLETED


async def rollout(
    client: AsyncSandboxClient,
    task: WebTask,
    model: ModelConfig,
    run_dir: str | Path,
    *,
    attempt: int = 0,
    harness: HarnessConfig | None = None,
    image: str | None = None,
    memory: str = "2Gi",
) -> Trajectory:
    """One episode of ``task`` in a new sandbox (deleted after), its status recorded; a
    sandbox or browser that fails becomes an ``aborted`` trajectory, never an exception."""
    traj: Trajectory | None = None
    try:
        chosen = image or default_image((await client.health()).backend)
        async with browser_sandbox(client, image=chosen, offline=task.offline, memory=memory) as (
            sandbox,
            browser,
        ):
            traj = await run_episode(
                sandbox, browser, task, model, run_dir, config=harness, attempt=attempt
            )
    except Exception as exc:
        if traj is None:
            traj = error_trajectory(task, attempt, model.model, exc)
        else:  # the episode ran; only deleting its sandbox failed
            traj.metadata.extra["cleanup_error"] = f"{type(exc).__name__}: {exc}"
    traj.metadata.extra["rollout_status"] = rollout_status(traj)
    return traj


async def rollout_group(
    client: AsyncSandboxClient,
    task: WebTask,
    model: ModelConfig,
    n: int,
    run_dir: str | Path,
    *,
    concurrency: int = 2,
    harness: HarnessConfig | None = None,
    image: str | None = None,
    memory: str = "2Gi",
    first_attempt: int = 0,
) -> Sequence[Trajectory]:
    """``n`` independent episodes of ``task`` (attempts ``first_attempt`` ...), in order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(attempt: int) -> Trajectory:
        async with gate:
            return await rollout(
                client,
                task,
                model,
                run_dir,
                attempt=attempt,
                harness=harness,
                image=image,
                memory=memory,
            )

    return await asyncio.gather(*(one(first_attempt + i) for i in range(n)))

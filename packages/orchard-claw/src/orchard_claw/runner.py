"""Run assistant tasks k times under one harness against an Orchard Env service.

``await evaluate(client, tasks, config)`` runs every (task, trial) with ``concurrency``
workers. Each trial gets a fresh sandbox (assistant tasks change their workspace): the
workspace is seeded, the task's service started, the harness run — ours
(:mod:`orchard_claw.harness`) or a foreign one inside the sandbox
(:mod:`orchard_claw.foreign_runner`) — and the task's checker grades the final state. The
sandbox is deleted whatever happens.

Everything lands in ``config.out_dir``: ``trajectories.jsonl`` (one line per trial,
appended as each ends; a rerun skips the trials already there and reruns the ones that
ended in an error) and ``results.json`` (per-task successes, pass@k / pass^k, turns,
tokens and time; see :func:`summarise`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from orchard_env_client import AsyncSandbox, AsyncSandboxClient
from orchard_env_client.llm import ModelConfig
from orchard_env_client.trajectory import (
    Trajectory,
    TrajectoryMetadata,
    append_jsonl,
    error_status,
    read_jsonl,
)

from .foreign_runner import ProxyHandle, bridges_for, run_foreign_episode
from .harness import HARNESS_NAME, HarnessConfig, run_episode
from .metrics import Trial, summarize
from .rubric import rubric_grade
from .tasks import ClawTask, check, seed_workspace, start_service

__all__ = ["EvalConfig", "TrialDone", "evaluate", "summarise", "trials_of"]

SANDBOX_LABELS = {"orchard.recipe": "claw"}
GRADING_TIMEOUT_S = 120.0


@attrs.define(frozen=True, kw_only=True)
class EvalConfig:
    """What to run and where the results go."""

    out_dir: Path
    model: ModelConfig
    image: str
    """The sandbox image: it must hold the harness (foreign ones need ``orchard-test/harnesses``)."""
    harness: str = HARNESS_NAME
    """``react`` (ours) or a foreign harness's name (see ``orchard_claw.foreign.HARNESSES``)."""
    harness_config: HarnessConfig = attrs.Factory(HarnessConfig)
    trials: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    concurrency: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    memory: str = "2Gi"
    foreign_timeout_s: float = 600.0
    """Time limit of one foreign-harness run."""
    rubric_judge: ModelConfig | None = None
    """A judge model for the tasks' rubrics (:mod:`orchard_claw.rubric`); None: no judge."""


@attrs.define(frozen=True)
class TrialDone:
    """Progress report of one finished trial."""

    task_id: str
    attempt: int
    exit_status: str
    reward: float | None
    duration_s: float


def error_trajectory(
    task: ClawTask, attempt: int, config: EvalConfig, exc: BaseException | str
) -> Trajectory:
    """The record of a trial that could not run (no sandbox, seeding failed, ...)."""
    now = time.time()
    what = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return Trajectory(
        metadata=TrajectoryMetadata(
            task_id=task.id,
            recipe="claw",
            harness=config.harness,
            model=config.model.model,
            attempt=attempt,
            exit_status=error_status(what),
            started_at=now,
            finished_at=now,
            error=what,
        )
    )


@contextlib.asynccontextmanager
async def task_sandbox(
    client: AsyncSandboxClient, task: ClawTask, config: EvalConfig, proxy: ProxyHandle | None
) -> AsyncIterator[AsyncSandbox]:
    """A new, network-blocked sandbox with the task's workspace seeded and its service up;
    a foreign harness also gets the bridge to the recording proxy. Deleted on exit."""
    bridges = bridges_for(proxy) if proxy is not None else None
    sandbox = await client.create_sandbox(
        config.image,
        block_network=True,
        memory=config.memory,
        labels=dict(SANDBOX_LABELS),
        bridges=bridges,
    )
    try:
        await seed_workspace(sandbox, task)
        await start_service(sandbox, task)
        yield sandbox
    finally:
        with contextlib.suppress(Exception):
            await sandbox.delete()


async def run_trial(
    client: AsyncSandboxClient,
    task: ClawTask,
    attempt: int,
    config: EvalConfig,
    proxy: ProxyHandle | None,
) -> Trajectory:
    """One trial, graded; never raises (a failure is an ``error: ...`` trajectory)."""
    try:
        async with task_sandbox(client, task, config, proxy) as sandbox:
            if proxy is None:
                traj = await run_episode(
                    sandbox, task, config.model, config=config.harness_config, attempt=attempt
                )
            else:
                traj = await run_foreign_episode(
                    sandbox,
                    task,
                    config.model,
                    proxy,
                    harness=config.harness,
                    attempt=attempt,
                    timeout_s=config.foreign_timeout_s,
                )
            if not traj.metadata.exit_status.startswith("error"):
                await _grade(sandbox, task, traj)
                if config.rubric_judge is not None and task.rubric:
                    await _judge(sandbox, task, traj, config.rubric_judge)
            return traj
    except Exception as exc:
        return error_trajectory(task, attempt, config, exc)


async def _grade(sandbox: AsyncSandbox, task: ClawTask, traj: Trajectory) -> None:
    meta = traj.metadata
    try:
        result = await asyncio.wait_for(check(sandbox, task), GRADING_TIMEOUT_S)
    except Exception as exc:
        meta.error = f"grading: {type(exc).__name__}: {exc}"
        meta.exit_status = error_status(meta.error)
        return
    meta.reward = 1.0 if result.passed else 0.0
    meta.verdict = "pass" if result.passed else "fail"
    meta.extra["check"] = {
        "passed": result.passed,
        "score": result.score,
        "details": list(result.details),
    }


async def _judge(
    sandbox: AsyncSandbox, task: ClawTask, traj: Trajectory, judge: ModelConfig
) -> None:
    """The rubric judge's word, kept beside the checker's (never the reward)."""
    try:
        verdict = await asyncio.wait_for(
            rubric_grade(sandbox, task, traj.metadata.final_output, judge), GRADING_TIMEOUT_S
        )
    except Exception as exc:
        traj.metadata.extra["rubric"] = {"error": f"{type(exc).__name__}: {exc}"}
        return
    if verdict is not None:
        traj.metadata.extra["rubric"] = verdict.to_dict()


def _latest(trajectories: Sequence[Trajectory], harness: str) -> dict[tuple[str, int], Trajectory]:
    """The last line of each (task, trial) of ``harness``: a rerun replaces an errored one."""
    return {
        (t.metadata.task_id, t.metadata.attempt): t
        for t in trajectories
        if t.metadata.harness == harness
    }


def _done_keys(path: Path, harness: str) -> set[tuple[str, int]]:
    if not path.exists():
        return set()
    latest = _latest(read_jsonl(path), harness)
    return {k for k, t in latest.items() if not t.metadata.exit_status.startswith("error")}


async def evaluate(
    client: AsyncSandboxClient,
    tasks: Sequence[ClawTask],
    config: EvalConfig,
    *,
    proxy: ProxyHandle | None = None,
    on_done: Callable[[TrialDone], None] | None = None,
) -> dict[str, Any]:
    """Run every (task, trial) not yet in the output file; returns the summary written to
    ``results.json``. A foreign harness needs ``proxy`` (a running recording proxy in front
    of the model, see :func:`orchard_claw.foreign_runner.recording_proxy`)."""
    if config.harness != HARNESS_NAME and proxy is None:
        raise ValueError(f"the foreign harness {config.harness!r} needs a recording proxy")
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "trajectories.jsonl"
    done = _done_keys(jsonl, config.harness)
    queue: asyncio.Queue[tuple[ClawTask, int]] = asyncio.Queue()
    for attempt in range(config.trials):
        for task in tasks:
            if (task.id, attempt) not in done:
                queue.put_nowait((task, attempt))
    foreign_proxy = None if config.harness == HARNESS_NAME else proxy

    async def work() -> None:
        while not queue.empty():
            task, attempt = queue.get_nowait()
            traj = await run_trial(client, task, attempt, config, foreign_proxy)
            append_jsonl(jsonl, traj)
            if on_done is not None:
                m = traj.metadata
                on_done(TrialDone(m.task_id, m.attempt, m.exit_status, m.reward, m.duration_s))

    await asyncio.gather(*(work() for _ in range(min(config.concurrency, max(1, queue.qsize())))))
    summary = summarise(read_jsonl(jsonl), harness=config.harness, k=config.trials)
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def trials_of(trajectories: Sequence[Trajectory], harness: str) -> list[Trial]:
    """The graded trials of ``harness`` (the last line of each (task, trial)); an errored
    trial counts as a failure, never left out."""
    return _trials(_latest(trajectories, harness))


def _trials(latest: dict[tuple[str, int], Trajectory]) -> list[Trial]:
    return [
        Trial(
            task_id=m.task_id,
            passed=(m.reward or 0.0) > 0,
            score=float((m.extra.get("check") or {}).get("score") or 0.0),
            turns=m.steps,
            tokens=m.prompt_tokens + m.completion_tokens,
            wall_time_s=m.duration_s,
        )
        for m in (t.metadata for _, t in sorted(latest.items()))
    ]


def summarise(trajectories: Sequence[Trajectory], *, harness: str, k: int) -> dict[str, Any]:
    """The harness's row (pass@1, pass@k, pass^k with intervals, mean turns, tokens, wall
    time; see :func:`orchard_claw.metrics.summarize`), errors and exit statuses."""
    latest = _latest(trajectories, harness)
    statuses: dict[str, int] = {}
    for t in latest.values():
        key = t.metadata.exit_status.split(":", 1)[0]
        statuses[key] = statuses.get(key, 0) + 1
    trials = _trials(latest)
    return {
        "harness": harness,
        "k": k,
        "trials": len(trials),
        "errors": statuses.get("error", 0),
        "exit_statuses": dict(sorted(statuses.items())),
        "summary": summarize(harness, trials, k).to_dict() if trials else None,
    }

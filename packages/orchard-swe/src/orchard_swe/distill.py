"""The distillation runner: every task K times through a harness, graded, written as JSONL.

Resumable: ``<out>/trajectories.jsonl`` is appended one fsync'd line per finished attempt,
and a restart skips the (instance, attempt) pairs already in it. ``<out>/summary.json`` is
rewritten at the end: resolved rate, tokens, cost, failures by cause.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchard_env_client import AsyncSandbox, AsyncSandboxClient, SandboxClient
from orchard_env_client.llm import ModelConfig

from .environment import prepare
from .grading import grade
from .tasks import Task
from .trajectory import Trajectory, TrajectoryMetadata, append_jsonl, error_status, read_jsonl

Harness = Literal["mini", "tools"]
TRAJECTORIES = "trajectories.jsonl"


@attrs.define
class DistillConfig:
    """What to run: harness, model, repetitions, limits, where to write."""

    harness: Harness
    model: ModelConfig
    out_dir: Path
    attempts: int = 1
    concurrency: int = 4
    max_steps: int = 30
    max_cost: float = 3.0
    backend: str | None = None
    default_image: str | None = None
    grade: bool = True


def finished_attempts(out_dir: Path) -> set[tuple[str, int]]:
    """(instance, attempt) pairs already written: a rerun skips them."""
    path = out_dir / TRAJECTORIES
    if not path.exists():
        return set()
    return {(t.metadata.task_id, t.metadata.attempt) for t in read_jsonl(path)}


async def _run_harness(
    client: AsyncSandboxClient,
    sandbox: AsyncSandbox,
    task: Task,
    attempt: int,
    repo_dir: str,
    config: DistillConfig,
) -> Trajectory:
    if config.harness == "tools":
        from .harness.tools import run_tools_agent

        return await run_tools_agent(
            sandbox,
            task.problem_statement,
            model=config.model,
            instance_id=task.instance_id,
            repo_dir=repo_dir,
            max_steps=config.max_steps,
            max_cost=config.max_cost,
            attempt=attempt,
        )
    from .harness.mini import run_mini_agent

    traj_dir = config.out_dir / "mini"
    traj_dir.mkdir(parents=True, exist_ok=True)

    def in_thread() -> Trajectory:
        # mini-swe-agent is synchronous: it gets its own sync handle on the same sandbox.
        with SandboxClient(base_url=client.base_url, auto_cleanup=False) as sync_client:
            return run_mini_agent(
                sync_client.get_sandbox(sandbox.sandbox_id),
                task.problem_statement,
                model=config.model,
                instance_id=task.instance_id,
                traj_dir=traj_dir,
                repo_dir=repo_dir,
                step_limit=config.max_steps,
                cost_limit=config.max_cost,
                attempt=attempt,
            )

    return await asyncio.to_thread(in_thread)


def failed_trajectory(task: Task, attempt: int, harness: str, model: str, error: str) -> Trajectory:
    """The record of an attempt that could not run: no messages, verdict ``error``."""
    now = time.time()
    metadata = TrajectoryMetadata(
        task_id=task.instance_id,
        recipe="swe",
        harness=harness,
        model=model,
        attempt=attempt,
        exit_status=error_status(error),
        started_at=now,
        finished_at=now,
        error=error,
        verdict="error",
    )
    return Trajectory(messages=[], tools=[], metadata=metadata)


HarnessRun = Callable[[AsyncSandbox, str], Awaitable[Trajectory]]
"""A harness episode: given the prepared sandbox and its repository dir, the trajectory."""


async def graded_attempt(
    client: AsyncSandboxClient,
    task: Task,
    attempt: int,
    run: HarnessRun,
    *,
    harness: str,
    model: str,
    backend: str | None = None,
    default_image: str | None = None,
    grade_it: bool = True,
    labels: Mapping[str, str] | None = None,
) -> Trajectory:
    """One episode of any harness in a fresh sandbox, then graded in another.

    Errors preparing the sandbox or inside the harness become the record (verdict
    ``error``), never lost; the sandbox is deleted either way.
    """
    try:
        sandbox, spec = await prepare(
            client,
            task,
            backend=backend,
            default_image=default_image,
            labels={"orchard-swe-role": "rollout", **(labels or {})},
            hide_history=True,
        )
    except Exception as exc:  # recorded as the attempt's result, never lost
        return failed_trajectory(task, attempt, harness, model, f"environment: {exc}")
    try:
        trajectory = await run(sandbox, spec.repo_dir)
    except Exception as exc:  # a harness crash is a result too
        error = f"harness: {type(exc).__name__}: {exc}"
        return failed_trajectory(task, attempt, harness, model, error)
    finally:
        await sandbox.delete()
    if grade_it:
        result = await grade(
            client,
            task,
            trajectory.metadata.final_output,
            backend=backend,
            default_image=default_image,
        )
        trajectory.metadata.verdict = result.status
        trajectory.metadata.extra["grading"] = result.to_dict()
    return trajectory


async def run_attempt(
    client: AsyncSandboxClient, task: Task, attempt: int, config: DistillConfig
) -> Trajectory:
    """One episode of ``config.harness`` in a fresh sandbox, then graded (:func:`graded_attempt`);
    a Terminal-Bench task is set up and verified by its own tests instead
    (:func:`orchard_swe.terminal_bench.run_attempt`)."""

    async def run(sandbox: AsyncSandbox, repo_dir: str) -> Trajectory:
        return await _run_harness(client, sandbox, task, attempt, repo_dir, config)

    from . import terminal_bench  # it builds on this module

    if terminal_bench.is_terminal_bench_task(task):
        return await terminal_bench.run_attempt(
            client, task, run, harness=config.harness, model=config.model.model, attempt=attempt
        )

    return await graded_attempt(
        client,
        task,
        attempt,
        run,
        harness=config.harness,
        model=config.model.model,
        backend=config.backend,
        default_image=config.default_image,
        grade_it=config.grade,
    )


async def distill(
    client: AsyncSandboxClient, tasks: Sequence[Task], config: DistillConfig
) -> dict[str, Any]:
    """Run every unfinished (task, attempt), append each to the JSONL, write the summary."""
    config.out_dir.mkdir(parents=True, exist_ok=True)
    path = config.out_dir / TRAJECTORIES
    done = finished_attempts(config.out_dir)
    todo = [(t, a) for t in tasks for a in range(config.attempts) if (t.instance_id, a) not in done]
    gate = asyncio.Semaphore(max(1, config.concurrency))
    progress = Progress(
        TextColumn(f"distill {config.harness}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[last]}"),
        TimeElapsedColumn(),
    )
    bar = progress.add_task("runs", total=len(todo), last="")

    async def one(task: Task, attempt: int) -> None:
        async with gate:
            trajectory = await run_attempt(client, task, attempt, config)
        append_jsonl(path, trajectory)
        status = trajectory.metadata.verdict or trajectory.metadata.exit_status
        progress.update(bar, advance=1, last=f"{task.instance_id}#{attempt}: {status}")

    with progress:
        await asyncio.gather(*(one(t, a) for t, a in todo))
    summary = summarize(read_jsonl(path), skipped=len(done))
    (config.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def summarize(trajectories: Sequence[Trajectory], skipped: int = 0) -> dict[str, Any]:
    """Resolved rate, tokens, cost and failures by cause over a run's trajectories."""
    metas = [t.metadata for t in trajectories]
    verify = Counter(m.verdict or "ungraded" for m in metas)
    exits = Counter(m.exit_status for m in metas)
    causes = Counter(
        (m.error or m.exit_status).split(":")[0] for m in metas if m.verdict != "resolved"
    )
    total = len(metas)
    return {
        "attempts": total,
        "resumed_from_earlier_run": skipped,
        "instances": len({m.task_id for m in metas}),
        "resolved": verify.get("resolved", 0),
        "resolved_rate": verify.get("resolved", 0) / total if total else 0.0,
        "verify_status": dict(verify),
        "exit_status": dict(exits),
        "failures_by_cause": dict(causes),
        "prompt_tokens": sum(m.prompt_tokens for m in metas),
        "completion_tokens": sum(m.completion_tokens for m in metas),
        "cost": sum(m.cost for m in metas),
        "mean_duration_s": sum(m.duration_s for m in metas) / total if total else 0.0,
    }

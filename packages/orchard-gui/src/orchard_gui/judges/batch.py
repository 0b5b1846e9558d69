"""Judge every trajectory of a run file into a new, resumable JSONL file."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import attrs

from orchard_env_client.llm import ChatClient, ModelConfig
from orchard_env_client.trajectory import Trajectory, append_jsonl, iter_jsonl

from .core import JudgeConfig, JudgeMethod, judge_trajectory

__all__ = ["JudgeFileSummary", "judge_file", "judged_copy", "trajectory_key"]

log = logging.getLogger(__name__)


def trajectory_key(traj: Trajectory) -> tuple[str, int, str, float]:
    """What identifies an episode within a run: task, attempt, model and start time."""
    meta = traj.metadata
    return (meta.task_id, meta.attempt, meta.model, round(meta.started_at, 6))


@attrs.define(kw_only=True)
class JudgeFileSummary:
    """What :func:`judge_file` did."""

    out_path: Path
    judged: int = 0
    skipped: int = 0
    """Already in ``out_path`` from an earlier run."""
    verdicts: dict[str, int] = attrs.field(factory=dict)
    """Counts of ``success`` / ``failure`` / ``unknown`` among the ones judged now."""
    failed: list[dict[str, Any]] = attrs.field(factory=list)
    """Trajectories whose judging raised (not written: a rerun retries them), with the error."""


def judged_copy(traj: Trajectory, judgment: dict[str, Any]) -> Trajectory:
    """``traj`` with ``reward`` / ``verdict`` from the judge and the details in
    ``metadata.extra["judge"]`` (the values they replace kept under ``"previous"``)."""
    meta = attrs.evolve(
        traj.metadata,
        reward=judgment["reward"],
        verdict=judgment["verdict"],
        extra={
            **traj.metadata.extra,
            "judge": {
                **judgment,
                "previous": {"reward": traj.metadata.reward, "verdict": traj.metadata.verdict},
            },
        },
    )
    return attrs.evolve(traj, metadata=meta)


async def judge_file(
    jsonl_path: str | os.PathLike[str],
    client: ChatClient | ModelConfig,
    out_path: str | os.PathLike[str] | None = None,
    *,
    method: JudgeMethod = "webjudge",
    config: JudgeConfig | None = None,
    concurrency: int = 4,
) -> JudgeFileSummary:
    """Judge every trajectory of ``jsonl_path`` and append each, judged, to ``out_path``.

    ``out_path`` defaults to ``<stem>.judged-<method>.jsonl`` beside the input, and must be
    in the input's directory (the artifact paths inside the records are relative to it);
    the input file is never written. Trajectories already in ``out_path`` (same
    :func:`trajectory_key`) are skipped, so an interrupted run resumes. A trajectory whose
    judging fails (a model error, an unreadable artifact) is logged and listed in the
    summary's ``failed``, not written, and the others go on. ``client`` may be a
    :class:`ModelConfig`, for which a client is opened and closed here.
    """
    if isinstance(client, ModelConfig):
        async with ChatClient(client) as owned:
            return await judge_file(
                jsonl_path, owned, out_path, method=method, config=config, concurrency=concurrency
            )
    source = Path(jsonl_path)
    target = (
        Path(out_path)
        if out_path is not None
        else source.with_name(f"{source.stem}.judged-{method}.jsonl")
    )
    if target.resolve() == source.resolve():
        raise ValueError(f"judge_file writes a new file; out_path is the input {source}")
    if target.parent.resolve() != source.parent.resolve():
        raise ValueError(
            f"out_path {target} must be in the directory of {source}: the records' artifact "
            "paths are relative to it"
        )
    done: set[tuple[str, int, str, float]] = set()
    if target.exists():
        done = {trajectory_key(t) for t in iter_jsonl(target)}
    summary = JudgeFileSummary(out_path=target)
    pending = []
    for traj in iter_jsonl(source):
        key = trajectory_key(traj)
        if key in done:
            summary.skipped += 1
            continue
        done.add(key)
        pending.append(traj)

    limit = asyncio.Semaphore(concurrency)

    async def one(traj: Trajectory) -> None:
        async with limit:
            try:
                result = await judge_trajectory(
                    traj, source.parent, client, method=method, config=config
                )
            except Exception as exc:
                log.warning(
                    "judging %s failed: %s: %s", trajectory_key(traj), type(exc).__name__, exc
                )
                summary.failed.append(
                    {
                        "task_id": traj.metadata.task_id,
                        "attempt": traj.metadata.attempt,
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                )
                return
        judged = judged_copy(traj, result.to_dict())
        await asyncio.to_thread(append_jsonl, target, judged)
        summary.judged += 1
        summary.verdicts[result.verdict] = summary.verdicts.get(result.verdict, 0) + 1

    await asyncio.gather(*(one(t) for t in pending))
    return summary

"""Run many browser episodes against an Orchard Env service: evaluation and data collection.

``await evaluate(client, tasks, config)`` runs every (task, attempt) with ``concurrency``
workers. Each worker owns one sandbox with Chromium in it (:func:`browser_sandbox`) and
runs its episodes there one after another: every episode starts from a fresh browser
context and, for the offline sites, freshly reset site state. A worker whose sandbox or
browser fails records the episode as an error and starts a new sandbox for the next one.

Everything lands in ``config.out_dir``: ``trajectories.jsonl`` (one line per episode,
appended as each ends; a rerun skips the episodes already there), the screenshots under
``artifacts/``, a contact sheet per episode under ``contact_sheets/`` and ``results.json``
(per-episode outcome, success rate, timings).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import statistics
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

from .browser import BrowserSession
from .harness import HARNESS_NAME, HarnessConfig, run_episode
from .tasks import WebTask, prepare_sandbox

__all__ = [
    "BROWSER_IMAGE",
    "EpisodeDone",
    "EvalConfig",
    "browser_sandbox",
    "default_image",
    "error_trajectory",
    "evaluate",
    "summarise",
]

log = logging.getLogger(__name__)

BROWSER_IMAGE = "orchard-test/browser"
"""The image with Chromium, Python and Playwright (``infra/images/build``)."""
SANDBOX_LABELS = {"orchard.recipe": "gui"}


def default_image(backend: str | None) -> str:
    """The image browser sandboxes use on ``backend``: the host's own root (and Chromium)
    on the local backend, the browser image elsewhere."""
    return "host" if backend == "local" else BROWSER_IMAGE


@attrs.define(frozen=True, kw_only=True)
class EvalConfig:
    """What to run and where the results go."""

    out_dir: Path
    model: ModelConfig
    harness: HarnessConfig = attrs.Factory(HarnessConfig)
    concurrency: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    attempts: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    image: str | None = None
    """None: :func:`default_image` for the service's backend."""
    memory: str = "2Gi"
    """Per browser sandbox (Chromium with a page takes ~350 MB)."""
    viewport: tuple[int, int] = (1280, 720)
    contact_sheets: bool = True


@attrs.define(frozen=True)
class EpisodeDone:
    """Progress report of one finished episode."""

    task_id: str
    attempt: int
    exit_status: str
    reward: float | None
    duration_s: float


@contextlib.asynccontextmanager
async def browser_sandbox(
    client: AsyncSandboxClient,
    *,
    image: str,
    offline: bool = True,
    memory: str = "2Gi",
    viewport: tuple[int, int] = (1280, 720),
) -> AsyncIterator[tuple[AsyncSandbox, BrowserSession]]:
    """A new sandbox with Chromium running in it (and the offline sites when ``offline``);
    deleted on exit. The network is blocked unless a task needs the open web."""
    sandbox = await client.create_sandbox(
        image, block_network=offline, memory=memory, labels=dict(SANDBOX_LABELS)
    )
    try:
        if offline:
            await prepare_sandbox(sandbox)
        async with await BrowserSession.start(sandbox, viewport=viewport) as browser:
            yield sandbox, browser
    finally:
        await sandbox.delete()


def _done_keys(path: Path) -> set[tuple[str, int]]:
    """Episodes already in the file; one that ended in an error is run again."""
    if not path.exists():
        return set()
    return {
        (key, attempt) for (key, attempt), t in _latest(read_jsonl(path)).items() if not _errored(t)
    }


def _errored(traj: Trajectory) -> bool:
    return traj.metadata.exit_status.startswith("error")


def _latest(trajectories: Sequence[Trajectory]) -> dict[tuple[str, int], Trajectory]:
    """The last line of each (task, attempt): a rerun of an errored episode replaces it."""
    return {(t.metadata.task_id, t.metadata.attempt): t for t in trajectories}


def error_trajectory(task: WebTask, attempt: int, model: str, exc: BaseException) -> Trajectory:
    """The record of an episode that could not run (no sandbox, no browser)."""
    now = time.time()
    return Trajectory(
        metadata=TrajectoryMetadata(
            task_id=task.task_id,
            recipe="gui",
            harness=HARNESS_NAME,
            model=model,
            attempt=attempt,
            exit_status=error_status(exc),
            started_at=now,
            finished_at=now,
            error=f"{type(exc).__name__}: {exc}",
            extra={"task": task.to_dict()},
        )
    )


class _Worker:
    """One sandbox with a browser, reused across episodes; replaced after a failure."""

    def __init__(self, client: AsyncSandboxClient, config: EvalConfig, image: str) -> None:
        self.client = client
        self.config = config
        self.image = image
        self._stack: contextlib.AsyncExitStack | None = None
        self._session: tuple[AsyncSandbox, BrowserSession] | None = None
        self._offline: bool | None = None
        self.startup_s: list[float] = []

    async def session(self, offline: bool) -> tuple[AsyncSandbox, BrowserSession]:
        if self._session is not None and self._offline == offline:
            return self._session
        await self.close()
        started = time.monotonic()
        stack = contextlib.AsyncExitStack()
        try:
            self._session = await stack.enter_async_context(
                browser_sandbox(
                    self.client,
                    image=self.image,
                    offline=offline,
                    memory=self.config.memory,
                    viewport=self.config.viewport,
                )
            )
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self._offline = stack, offline
        self.startup_s.append(time.monotonic() - started)
        return self._session

    async def close(self) -> None:
        stack, self._stack, self._session = self._stack, None, None
        if stack is not None:
            with contextlib.suppress(Exception):
                await stack.aclose()

    async def run(self, task: WebTask, attempt: int) -> Trajectory:
        try:
            sandbox, browser = await self.session(task.offline)
        except Exception as exc:
            return error_trajectory(task, attempt, self.config.model.model, exc)
        traj = await run_episode(
            sandbox,
            browser,
            task,
            self.config.model,
            self.config.out_dir,
            config=self.config.harness,
            attempt=attempt,
        )
        if traj.metadata.exit_status.startswith("error"):
            await self.close()  # the sandbox or browser may be broken: the next one is new
        return traj


async def evaluate(
    client: AsyncSandboxClient,
    tasks: Sequence[WebTask],
    config: EvalConfig,
    *,
    on_done: Callable[[EpisodeDone], None] | None = None,
) -> dict[str, Any]:
    """Run every (task, attempt) not yet in the output file; returns the summary written to
    ``results.json`` (see :func:`summarise`)."""
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "trajectories.jsonl"
    done = _done_keys(jsonl)
    queue: asyncio.Queue[tuple[WebTask, int]] = asyncio.Queue()
    for attempt in range(config.attempts):
        for task in tasks:
            if (task.task_id, attempt) not in done:
                queue.put_nowait((task, attempt))
    image = config.image or default_image((await client.health()).backend)
    workers = [
        _Worker(client, config, image)
        for _ in range(min(config.concurrency, max(1, queue.qsize())))
    ]

    async def work(worker: _Worker) -> None:
        try:
            while not queue.empty():
                task, attempt = queue.get_nowait()
                traj = await worker.run(task, attempt)
                append_jsonl(jsonl, traj)
                if config.contact_sheets:
                    try:
                        _write_contact_sheet(traj, out)
                    except Exception as exc:  # a picture for people: never the run's end
                        log.warning("contact sheet of %s failed: %s", traj.metadata.task_id, exc)
                if on_done is not None:
                    meta = traj.metadata
                    on_done(
                        EpisodeDone(
                            meta.task_id,
                            meta.attempt,
                            meta.exit_status,
                            meta.reward,
                            meta.duration_s,
                        )
                    )
        finally:
            await worker.close()

    await asyncio.gather(*(work(w) for w in workers))
    startups = [s for w in workers for s in w.startup_s]
    summary = summarise(read_jsonl(jsonl), image=image, sandbox_startup_s=startups)
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _write_contact_sheet(traj: Trajectory, out: Path) -> None:
    from .contact_sheet import contact_sheet

    if not traj.steps:
        return
    name = f"{traj.metadata.task_id}-{traj.metadata.attempt}.png".replace("/", "_")
    contact_sheet(traj, out, out / "contact_sheets" / name)


def _p50(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def summarise(
    trajectories: Sequence[Trajectory],
    *,
    image: str | None = None,
    sandbox_startup_s: Sequence[float] = (),
) -> dict[str, Any]:
    """Success rate, outcomes and timings of a run's episodes (the last line of each).

    An episode succeeds when its reward is > 0 (programmatic, or a judge's 1.0). The rate is
    over the rewarded episodes plus the ones that ended in an error (an error is a failure,
    never left out); episodes of online tasks not yet judged are counted apart.
    """
    trajectories = list(_latest(trajectories).values())
    rewarded = [t for t in trajectories if t.metadata.reward is not None]
    errors = [t for t in trajectories if t.metadata.reward is None and _errored(t)]
    successes = sum(1 for t in rewarded if (t.metadata.reward or 0) > 0)
    graded = len(rewarded) + len(errors)
    statuses: dict[str, int] = {}
    for t in trajectories:
        key = t.metadata.exit_status.split(":", 1)[0]
        statuses[key] = statuses.get(key, 0) + 1
    step_latency = [
        float(s.extra["latency_s"]) for t in trajectories for s in t.steps if "latency_s" in s.extra
    ]
    episodes = [
        {
            "task_id": t.metadata.task_id,
            "attempt": t.metadata.attempt,
            "exit_status": t.metadata.exit_status,
            "reward": t.metadata.reward,
            "answer": t.metadata.final_output,
            "steps": t.metadata.steps,
            "duration_s": round(t.metadata.duration_s, 3),
        }
        for t in trajectories
    ]
    return {
        "episodes": len(trajectories),
        "rewarded": len(rewarded),
        "successes": successes,
        "errors": len(errors),
        "success_rate": round(successes / graded, 4) if graded else None,
        "unrewarded": len(trajectories) - graded,
        "exit_statuses": dict(sorted(statuses.items())),
        "image": image,
        "step_latency_p50_s": _p50(step_latency),
        "episode_duration_p50_s": _p50([t.metadata.duration_s for t in trajectories]),
        "sandbox_startup_p50_s": _p50(list(sandbox_startup_s)),
        "results": episodes,
    }

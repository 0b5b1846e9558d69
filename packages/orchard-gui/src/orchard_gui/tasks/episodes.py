"""The task side of one episode: set the start page up, then grade the end state."""

from __future__ import annotations

from typing import Any, Protocol

from orchard_env_client import AsyncSandbox
from orchard_env_client.errors import OrchardError
from orchard_gui.browser import BrowserError, BrowserSession, Observation
from orchard_gui.tasks.local import score_local
from orchard_gui.tasks.miniwob import RESULT_JS, episode_start_js
from orchard_gui.tasks.sandbox import prepare_sandbox, reset_site_state, site_state
from orchard_gui.tasks.schema import TaskError, WebTask

__all__ = [
    "LocalSiteEpisode",
    "MiniWoBEpisode",
    "OnlineEpisode",
    "TaskEpisode",
    "episode_for",
]


class TaskEpisode(Protocol):
    """The task side of one episode (``episode_for(task)`` makes one)."""

    task: WebTask
    info: dict[str, Any]
    """Details of the grading after ``reward`` (e.g. MiniWoB's raw reward and reason)."""

    async def start(
        self,
        sandbox: AsyncSandbox,
        browser: BrowserSession,
        *,
        marks: bool = True,
        axtree: bool = False,
    ) -> tuple[str, Observation]:
        """Reset the browser to the task's start and return (instruction, first observation)."""
        ...

    async def reward(
        self, sandbox: AsyncSandbox, browser: BrowserSession, answer: str | None
    ) -> float | None:
        """The programmatic reward in [0, 1], or ``None`` when a judge must decide."""
        ...


class _Episode:
    """What every episode driver holds: its task and the details of its grading."""

    def __init__(self, task: WebTask) -> None:
        self.task = task
        self.info: dict[str, Any] = {}


class OnlineEpisode(_Episode):
    """A task on the open web (WebVoyager, Online-Mind2Web, DeepShop): no programmatic reward."""

    async def start(
        self,
        sandbox: AsyncSandbox,
        browser: BrowserSession,
        *,
        marks: bool = True,
        axtree: bool = False,
    ) -> tuple[str, Observation]:
        """Open the start URL (the sandbox needs network access for it)."""
        observation = await browser.reset(self.task.start_url, marks=marks, axtree=axtree)
        return self.task.instruction, observation

    async def reward(
        self, sandbox: AsyncSandbox, browser: BrowserSession, answer: str | None
    ) -> float | None:
        """Always ``None``: a judge grades online tasks."""
        return None


class LocalSiteEpisode(_Episode):
    """A task on the offline sites: fresh site state, then the checker on ``/__state``."""

    async def start(
        self,
        sandbox: AsyncSandbox,
        browser: BrowserSession,
        *,
        marks: bool = True,
        axtree: bool = False,
    ) -> tuple[str, Observation]:
        """Make sure the site server runs, forget earlier episodes' state, open the start page."""
        await prepare_sandbox(sandbox)
        await reset_site_state(sandbox)
        observation = await browser.reset(self.task.start_url, marks=marks, axtree=axtree)
        return self.task.instruction, observation

    async def reward(
        self, sandbox: AsyncSandbox, browser: BrowserSession, answer: str | None
    ) -> float | None:
        """1.0 when the end state (or the answer) matches the task's expectation, else 0.0."""
        state = await site_state(sandbox)
        value = score_local(self.task, state, answer)
        self.info = {"checker": self.task.extra.get("checker"), "state": state, "answer": answer}
        return value


class MiniWoBEpisode(_Episode):
    """A MiniWoB++ task: a seeded episode with a long time limit; reward ``max(raw, 0)``."""

    async def start(
        self,
        sandbox: AsyncSandbox,
        browser: BrowserSession,
        *,
        marks: bool = True,
        axtree: bool = False,
    ) -> tuple[str, Observation]:
        """Open the task page, start the seeded episode and read its utterance."""
        await prepare_sandbox(sandbox)
        await browser.reset(self.task.start_url, marks=False)
        seed = int(self.task.extra.get("seed", 0))
        started = await browser.evaluate(episode_start_js(seed))
        if (
            not isinstance(started, dict)
            or not started.get("ready")
            or not started.get("utterance")
        ):
            raise TaskError(f"MiniWoB++ episode {self.task.task_id} did not start: {started!r}")
        instruction = str(started["utterance"])
        self.task.instruction = instruction
        observation = await browser.observe(marks=marks, axtree=axtree)
        return instruction, observation

    async def reward(
        self, sandbox: AsyncSandbox, browser: BrowserSession, answer: str | None
    ) -> float | None:
        """``max(raw, 0)`` of the episode's first end (0.0 if it has not ended).

        Read from the active tab: an agent that navigated away from the task page scores 0.
        """
        try:
            value = await browser.evaluate(RESULT_JS)
        except (BrowserError, OrchardError) as exc:  # the page is gone: no end of episode
            self.info = {"error": f"{type(exc).__name__}: {exc}"}
            return 0.0
        result = value.get("result") if isinstance(value, dict) else None
        self.info = {"result": result, "page": value}
        if not isinstance(result, dict) or result.get("raw") is None:
            return 0.0
        return max(0.0, min(1.0, float(result["raw"])))


def episode_for(task: WebTask) -> TaskEpisode:
    """The episode driver of a task, by its source."""
    if task.source == "miniwob":
        return MiniWoBEpisode(task)
    if task.source == "local":
        return LocalSiteEpisode(task)
    if task.offline:
        raise TaskError(f"task {task.task_id}: no offline driver for source {task.source!r}")
    return OnlineEpisode(task)

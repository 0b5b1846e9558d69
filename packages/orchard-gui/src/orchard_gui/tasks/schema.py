"""The task record every loader produces: ``WebTask``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["SOURCES", "TaskError", "WebTask"]

SOURCES = ("webvoyager", "online-mind2web", "deepshop", "miniwob", "local")
"""Where a task comes from (``WebTask.source``)."""


class TaskError(ValueError):
    """A task spec, file or record that cannot be loaded (the message says why and where)."""


@attrs.define(kw_only=True)
class WebTask:
    """One browser task: what to do, where to start, and how it is graded.

    ``start_url`` is the address as the browser inside the sandbox sees it (offline tasks:
    ``http://127.0.0.1:8000/...``). ``instruction`` is empty for MiniWoB++ until the episode
    reads the page's utterance. ``offline`` tasks need no network and are graded
    programmatically; online ones (WebVoyager, Online-Mind2Web, DeepShop) are left to a judge.
    ``extra`` holds the source's own fields (and, for offline tasks, the seed, the checker's
    expectations and the scripted oracle's plan).
    """

    task_id: str
    instruction: str
    start_url: str
    source: str
    website: str = ""
    reference_answer: str | None = None
    level: str | None = None
    offline: bool = False
    extra: dict[str, Any] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``from_dict`` reads it back)."""
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WebTask:
        """Read ``to_dict``'s form; unknown keys are an error (a typo must not pass)."""
        names = {f.name for f in attrs.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise TaskError(f"WebTask: unknown field(s) {unknown}; known: {sorted(names)}")
        missing = [n for n in ("task_id", "instruction", "start_url", "source") if n not in d]
        if missing:
            raise TaskError(f"WebTask: missing field(s) {missing}")
        kwargs: dict[str, Any] = {k: (dict(v) if k == "extra" else v) for k, v in d.items()}
        return cls(**kwargs)

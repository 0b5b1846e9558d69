"""MiniWoB++ tasks: served from the ``miniwob`` package's pages inside the sandbox.

An episode is driven in the page (see ``/work/shared/RECIPE-NOTES.md``): seed
``Math.seedrandom(seed)``, raise ``core.EPISODE_MAX_TIME`` (MiniWoB's own 10 s would end an
episode while a model is still thinking), start with ``core.startEpisodeReal()``, wait for
``WOB_TASK_READY``, read ``core.getUtterance()``. The first ``core.endEpisode`` of the
episode is recorded in ``window.__orchard_wob`` (MiniWoB starts the next episode behind a
"START" cover at once, which would reset its own globals).

Reward: MiniWoB's raw reward is in [-1, 1] (-1 wrong or timed out, 1 right; a few tasks give
partial credit). The episode reward is ``max(raw, 0)`` in [0, 1]: success (raw > 0) keeps its
value, anything else (including no end of episode at all) is 0.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from orchard_gui.tasks.local import SITE_BASE
from orchard_gui.tasks.schema import TaskError, WebTask

__all__ = [
    "CURATED",
    "EPISODE_MAX_TIME_MS",
    "episode_start_js",
    "miniwob_html_dir",
    "miniwob_names",
    "miniwob_task",
    "miniwob_tasks",
    "parse_miniwob_spec",
]

CURATED: tuple[tuple[str, int], ...] = (
    ("click-button", 11),
    ("click-checkboxes", 12),
    ("click-dialog", 13),
    ("click-tab", 14),
    ("enter-text", 15),
    ("focus-text", 16),
    ("login-user", 17),
)
"""The curated MiniWoB++ set (task, seed): simple tasks the scripted oracle solves from the
numbered marks alone. (``click-link`` is left out: its links are bare ``<span>``s that no
mark names.)"""

EPISODE_MAX_TIME_MS = 30 * 60 * 1000
"""How long a MiniWoB episode may last here (MiniWoB's default is 10 s)."""


@functools.cache
def miniwob_html_dir() -> Path:
    """The installed ``miniwob`` package's ``html`` directory (core/, common/, miniwob/...)."""
    try:
        import miniwob
    except ImportError as exc:  # a declared dependency; say what is missing
        raise TaskError("MiniWoB++ tasks need the `miniwob` package installed") from exc
    path = Path(miniwob.__file__).parent / "html"
    if not (path / "miniwob").is_dir():
        raise TaskError(f"the miniwob package has no html/miniwob directory at {path}")
    return path


def miniwob_names() -> list[str]:
    """Every MiniWoB++ task name the installed package ships (130)."""
    return sorted(p.stem for p in (miniwob_html_dir() / "miniwob").glob("*.html"))


def miniwob_task(name: str, seed: int) -> WebTask:
    """The ``WebTask`` of MiniWoB++ task ``name`` with episode seed ``seed``."""
    if name not in miniwob_names():
        raise TaskError(
            f"no MiniWoB++ task {name!r} (the miniwob package has 130; e.g. click-button)"
        )
    return WebTask(
        task_id=f"miniwob-{name}-s{seed}",
        instruction="",
        start_url=f"{SITE_BASE}/miniwob/miniwob/{name}.html",
        source="miniwob",
        website="miniwob",
        offline=True,
        extra={"miniwob_task": name, "seed": seed},
    )


def parse_miniwob_spec(spec: str) -> list[WebTask]:
    """``NAME[@SEED][*COUNT]`` items, comma-separated (``*COUNT``: that many seeds from SEED,
    default seed 0). ``click-button@3,enter-text*2`` -> click-button seed 3, enter-text 0, 1."""
    tasks = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        match = re.fullmatch(r"([a-z0-9-]+)(?:@(\d+))?(?:\*(\d+))?", item)
        if not match:
            raise TaskError(f"bad MiniWoB++ item {item!r}: expected NAME[@SEED][*COUNT]")
        name, seed, count = match.group(1), int(match.group(2) or 0), int(match.group(3) or 1)
        tasks += [miniwob_task(name, seed + k) for k in range(count)]
    if not tasks:
        raise TaskError(f"no MiniWoB++ tasks in {spec!r}")
    return tasks


def miniwob_tasks() -> list[WebTask]:
    """The curated MiniWoB++ set (``CURATED``), with its fixed seeds."""
    return [miniwob_task(name, seed) for name, seed in CURATED]


def episode_start_js(seed: int, max_time_ms: int = EPISODE_MAX_TIME_MS) -> str:
    """JS (an async arrow function) that starts a seeded episode and resolves to
    ``{"ready": bool, "utterance": str}`` once ``WOB_TASK_READY`` (or after 10 s)."""
    return f"""async () => {{
  if (typeof core === 'undefined' || typeof genProblem === 'undefined')
    return {{ready: false, utterance: '', error: 'not a MiniWoB++ page'}};
  Math.seedrandom({json.dumps(str(seed))});
  core.EPISODE_MAX_TIME = {int(max_time_ms)};
  window.__orchard_wob = null;
  if (!core.__orchardWrapped) {{
    const original = core.endEpisode;
    core.endEpisode = function (reward, timeProportional, reason) {{
      if (core.EP_TIMER !== null && window.__orchard_wob === null)
        window.__orchard_wob = {{raw: reward, reason: reason === undefined ? null : reason}};
      return original.apply(this, arguments);
    }};
    core.__orchardWrapped = true;
  }}
  if (core.cover_div === null) core.startEpisode();
  core.startEpisodeReal();
  const t0 = Date.now();
  while (!WOB_TASK_READY && Date.now() - t0 < 10000)
    await new Promise((r) => setTimeout(r, 50));
  return {{ready: !!WOB_TASK_READY, utterance: core.getUtterance()}};
}}"""


RESULT_JS = """() => ({
  result: window.__orchard_wob === undefined ? null : window.__orchard_wob,
  done: typeof WOB_DONE_GLOBAL === 'undefined' ? null : WOB_DONE_GLOBAL,
  raw: typeof WOB_RAW_REWARD_GLOBAL === 'undefined' ? null : WOB_RAW_REWARD_GLOBAL,
})"""
"""JS that reads the recorded end of the episode (``result``: ``{raw, reason}`` or null)."""

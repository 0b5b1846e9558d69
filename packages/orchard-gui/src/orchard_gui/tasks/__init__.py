"""Web tasks: benchmark loaders, offline sites served inside the sandbox, MiniWoB++, checkers.

- ``load_tasks(spec)``: ``"offline"`` / ``"local"`` / ``"miniwob[:...]"`` or a WebVoyager,
  DeepShop, Online-Mind2Web (or ``WebTask``) file -> ``list[WebTask]``.
- ``episode_for(task)``: the task side of an episode: ``start`` (returns the instruction and
  the first observation) and ``reward`` (programmatic for offline tasks, ``None`` online).
- ``prepare_sandbox(sandbox)``: the offline site server on ``127.0.0.1:8000`` in the sandbox.
- ``oracle_action(...)``: a scripted policy that solves every offline task from the marks.
"""

from orchard_gui.tasks.episodes import (
    LocalSiteEpisode,
    MiniWoBEpisode,
    OnlineEpisode,
    TaskEpisode,
    episode_for,
)
from orchard_gui.tasks.loaders import load_tasks
from orchard_gui.tasks.local import SITE_BASE, SITE_PORT, local_tasks
from orchard_gui.tasks.miniwob import CURATED, miniwob_names, miniwob_task, miniwob_tasks
from orchard_gui.tasks.oracle import OracleError, oracle_action, oracle_plan
from orchard_gui.tasks.sandbox import prepare_sandbox, site_state
from orchard_gui.tasks.schema import SOURCES, TaskError, WebTask

__all__ = [
    "CURATED",
    "SITE_BASE",
    "SITE_PORT",
    "SOURCES",
    "LocalSiteEpisode",
    "MiniWoBEpisode",
    "OnlineEpisode",
    "OracleError",
    "TaskEpisode",
    "TaskError",
    "WebTask",
    "episode_for",
    "load_tasks",
    "local_tasks",
    "miniwob_names",
    "miniwob_task",
    "miniwob_tasks",
    "oracle_action",
    "oracle_plan",
    "prepare_sandbox",
    "site_state",
]

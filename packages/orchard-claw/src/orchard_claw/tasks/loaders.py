"""``load_tasks(spec)``: the built-in set, generated sets, task files and task directories.

A task directory holds one folder per task: ``<id>/task.json`` (the record without
``files`` and ``reference``), ``<id>/workspace/...`` (the seed files) and
``<id>/reference.sh``. ``save_tasks`` writes that layout; the built-in set ships in it
(``orchard_claw/tasks/data/builtin``). A ``.json`` list or ``.jsonl`` file holds
``ClawTask.to_dict()`` records (files and reference inline).
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from orchard_claw.tasks.generate import generate_many
from orchard_claw.tasks.schema import KINDS, ClawTask, TaskError

__all__ = ["builtin_tasks", "load_tasks", "read_task_dir", "save_tasks"]

_SPECS = "builtin, builtin:<kind>, gen:<template|kind|all>:<count>[:seed=N], a file or directory"


def load_tasks(spec: str | os.PathLike[str]) -> list[ClawTask]:
    """Tasks from a spec; several specs join with ``+`` (ids must stay unique).

    - ``builtin`` (every shipped task) or ``builtin:<kind>`` (one of ``KINDS``);
    - ``gen:<template|kind|all>:<count>[:seed=N]``: ``count`` generated tasks (seed 0 unless
      given), e.g. ``gen:email:20:seed=7``;
    - a ``.json``/``.jsonl`` file of ``ClawTask`` records, or a task directory (see above).
    """
    text = os.fspath(spec)
    tasks: list[ClawTask] = []
    for part in text.split("+") if not Path(text).exists() else [text]:
        tasks += _load_one(part.strip())
    return _unique(tasks, text)


def _load_one(spec: str) -> list[ClawTask]:
    if spec == "builtin":
        return builtin_tasks()
    if spec.startswith("builtin:"):
        kind = spec.split(":", 1)[1]
        if kind not in KINDS:
            raise TaskError(f"{spec!r}: kind must be one of {KINDS}")
        return [t for t in builtin_tasks() if t.kind == kind]
    if spec.startswith("gen:"):
        return _generated(spec)
    path = Path(spec)
    if path.is_dir():
        return [read_task_dir(d) for d in sorted(path.iterdir()) if (d / "task.json").is_file()]
    if path.is_file():
        return [
            ClawTask.from_dict(r, where=f"{path} record {i}")
            for i, r in enumerate(_records(path), start=1)
        ]
    raise TaskError(f"{spec!r} is neither a task set ({_SPECS}) nor an existing path")


def _generated(spec: str) -> list[ClawTask]:
    parts = spec.split(":")
    if len(parts) not in (3, 4) or (len(parts) == 4 and not parts[3].startswith("seed=")):
        raise TaskError(f"{spec!r}: expected gen:<template|kind|all>:<count>[:seed=N]")
    try:
        count = int(parts[2])
        seed = int(parts[3].removeprefix("seed=")) if len(parts) == 4 else 0
    except ValueError:
        raise TaskError(f"{spec!r}: count and seed must be integers") from None
    return generate_many(parts[1], count, seed)


def _unique(tasks: list[ClawTask], where: str) -> list[ClawTask]:
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise TaskError(f"{where}: duplicate task id {task.id!r}")
        seen.add(task.id)
    return tasks


def _records(path: Path) -> list[dict[str, Any]]:
    raw = path.read_text(encoding="utf-8")
    try:
        if raw.lstrip().startswith("["):
            records = json.loads(raw)
        else:
            records = [json.loads(line) for line in raw.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise TaskError(f"{path}: not a JSON list or JSON lines: {exc}") from None
    if not records or not all(isinstance(r, dict) for r in records):
        raise TaskError(f"{path}: expected one or more JSON objects")
    return records


def read_task_dir(folder: Path) -> ClawTask:
    """One task from its folder (``task.json``, ``workspace/``, ``reference.sh``)."""
    where = str(folder)
    try:
        record = json.loads((folder / "task.json").read_text(encoding="utf-8"))
        reference = (folder / "reference.sh").read_text(encoding="utf-8")
    except (OSError, json.JSONDecodeError) as exc:
        raise TaskError(f"{where}: {exc}") from None
    if not isinstance(record, dict):
        raise TaskError(f"{where}/task.json: expected a JSON object")
    if "files" in record or "reference" in record:
        raise TaskError(f"{where}/task.json: files and reference live beside it, not inside")
    seed = folder / "workspace"
    files = {
        str(p.relative_to(seed)): p.read_text(encoding="utf-8")
        for p in sorted(seed.rglob("*"))
        if p.is_file()
    }
    return ClawTask.from_dict({**record, "files": files, "reference": reference}, where=where)


def save_tasks(tasks: list[ClawTask], folder: str | os.PathLike[str]) -> Path:
    """Write ``tasks`` as a task directory (one folder a task) that ``load_tasks`` reads."""
    root = Path(folder)
    _unique(tasks, str(root))
    for task in tasks:
        target = root / task.id
        record = task.to_dict()
        files: dict[str, str] = record.pop("files")
        reference: str = record.pop("reference")
        target.mkdir(parents=True, exist_ok=True)
        (target / "task.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        (target / "reference.sh").write_text(reference, encoding="utf-8")
        for rel, content in files.items():
            path = target / "workspace" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
    return root


def builtin_tasks() -> list[ClawTask]:
    """The shipped tasks (``data/builtin``), sorted by id."""
    root = Path(str(resources.files("orchard_claw.tasks").joinpath("data", "builtin")))
    return sorted(load_tasks(root), key=lambda t: t.id)

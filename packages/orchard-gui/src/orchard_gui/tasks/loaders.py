"""``load_tasks(spec)``: built-in offline task sets, or benchmark files detected by content.

File formats (one record shape per file; the format is decided from the records' keys):

- WebVoyager ``.jsonl``: ``{"web_name", "id", "ques", "web"}`` per line. Reference answers
  (``reference_answer.json``: ``{web_name: {"answers": [{"id", "type", "ans"}]}}``, ``id``
  the number after ``--`` in the task id) can be attached with ``answers=``.
- DeepShop ``.jsonl``/``.json`` (``data/deepshop_*.jsonl`` of github.com/youganglyu/DeepShop
  and the Hugging Face ``DeepShop/DeepShop`` ``deepshop.jsonl``): WebVoyager's keys plus
  ``attribute``, ``filter``, ``sort``, ``category``, ``difficulty``.
- Online-Mind2Web ``.json``: a list of ``{"task_id", "confirmed_task", "website",
  "reference_length", "level"}``.
- ``WebTask.to_dict()`` records (``.json`` list or ``.jsonl``), as written by this package.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from orchard_gui.tasks.local import local_tasks
from orchard_gui.tasks.miniwob import miniwob_tasks, parse_miniwob_spec
from orchard_gui.tasks.schema import TaskError, WebTask

__all__ = ["attach_webvoyager_answers", "detect_format", "load_tasks", "read_records"]

_DEEPSHOP_KEYS = {"attribute", "filter", "sort", "category", "difficulty"}
_BUILTIN = "offline, local, local:<site>, miniwob, miniwob:<name>[@seed][*count],..."


def load_tasks(
    spec: str | os.PathLike[str], *, answers: str | os.PathLike[str] | None = None
) -> list[WebTask]:
    """Tasks from a built-in set name or a benchmark file.

    Built-in (all offline, graded programmatically): ``"offline"`` (the local sites' tasks and
    the curated MiniWoB++ set), ``"local"`` / ``"local:gazetteer|garden|shop"``, ``"miniwob"``
    (curated set with fixed seeds) or ``"miniwob:click-button,enter-text@3,focus-text*5"``
    (any of the 130: ``@SEED`` picks the seed, ``*COUNT`` that many seeds). Otherwise
    ``spec`` is a path to a WebVoyager, DeepShop, Online-Mind2Web or ``WebTask`` file (see the
    module docstring); ``answers`` attaches WebVoyager reference answers.
    """
    text = os.fspath(spec)
    if answers is not None and text in ("offline", "local", "miniwob"):
        raise TaskError("answers= applies to WebVoyager files only")
    if text == "offline":
        return _unique(local_tasks() + miniwob_tasks(), text)
    if text == "local":
        return _unique(local_tasks(), text)
    if text.startswith("local:"):
        return _unique(local_tasks(text.split(":", 1)[1]), text)
    if text == "miniwob":
        return _unique(miniwob_tasks(), text)
    if text.startswith("miniwob:"):
        return _unique(parse_miniwob_spec(text.split(":", 1)[1]), text)
    path = Path(text)
    if not path.is_file():
        raise TaskError(f"{text!r} is neither a task set ({_BUILTIN}) nor an existing file")
    records = read_records(path)
    fmt = detect_format(records, where=str(path))
    tasks = _unique(
        [_convert(fmt, r, f"{path} record {i + 1}") for i, r in enumerate(records)], str(path)
    )
    if answers is not None:
        if fmt != "webvoyager":
            raise TaskError(f"answers= applies to WebVoyager files only; {path} is {fmt}")
        attach_webvoyager_answers(tasks, answers)
    return tasks


def _unique(tasks: list[WebTask], where: str) -> list[WebTask]:
    """``tasks`` unless two share an id (they would share a run's records and artifacts)."""
    seen: set[str] = set()
    for task in tasks:
        if task.task_id in seen:
            raise TaskError(f"{where}: duplicate task id {task.task_id!r}")
        seen.add(task.task_id)
    return tasks


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a ``.json`` list or a JSON-lines file (blank lines skipped)."""
    raw = path.read_text(encoding="utf-8-sig")
    stripped = raw.lstrip()
    if not stripped:
        raise TaskError(f"{path}: empty file")
    records: list[Any]
    if stripped.startswith("["):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TaskError(f"{path}: not valid JSON: {exc}") from None
        records = data
    elif stripped.startswith("{"):
        records = []
        for n, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                # a single pretty-printed object is not a task file either
                raise TaskError(
                    f"{path} line {n}: not a JSON object per line ({exc.msg})"
                ) from None
    else:
        raise TaskError(f"{path}: expected a JSON list or JSON lines, found {stripped[:20]!r}")
    for i, record in enumerate(records, start=1):
        if not isinstance(record, dict):
            raise TaskError(
                f"{path} record {i}: expected a JSON object, got {type(record).__name__}"
            )
    if not records:
        raise TaskError(f"{path}: no task records")
    return records


def _format_of(record: Mapping[str, Any]) -> str | None:
    keys = set(record)
    if {"task_id", "instruction", "start_url", "source"} <= keys:
        return "webtask"
    if {"task_id", "confirmed_task", "website"} <= keys:
        return "online-mind2web"
    if {"id", "ques", "web"} <= keys:
        return "deepshop" if keys & _DEEPSHOP_KEYS else "webvoyager"
    return None


def detect_format(records: list[dict[str, Any]], *, where: str = "records") -> str:
    """``"webvoyager"``, ``"deepshop"``, ``"online-mind2web"`` or ``"webtask"``; every record
    must have the same shape (else ``TaskError`` naming the first odd one)."""
    first = _format_of(records[0])
    if first is None:
        raise TaskError(
            f"{where}: unknown task record shape (keys {sorted(records[0])}); expected "
            "WebVoyager {web_name,id,ques,web}, DeepShop (WebVoyager's keys + attribute, filter, "
            "sort, category, difficulty), Online-Mind2Web {task_id,confirmed_task,website,level} "
            "or WebTask {task_id,instruction,start_url,source}"
        )
    for i, record in enumerate(records[1:], start=2):
        fmt = _format_of(record)
        # DeepShop rows whose extra fields are absent still read as WebVoyager: allow the mix
        if fmt != first and {fmt, first} != {"webvoyager", "deepshop"}:
            raise TaskError(
                f"{where} record {i}: shape {fmt or 'unknown'} differs from record 1 ({first})"
            )
    if first == "webvoyager" and any(_format_of(r) == "deepshop" for r in records):
        return "deepshop"
    return first


def _text(record: Mapping[str, Any], key: str, where: str) -> str:
    value = record.get(key)
    if not isinstance(value, str | int) or isinstance(value, bool) or str(value).strip() == "":
        raise TaskError(f"{where}: field {key!r} must be a non-empty string, got {value!r}")
    return str(value).strip()


def _host(url: str) -> str:
    return urlsplit(url).hostname or url


def _convert(fmt: str, record: dict[str, Any], where: str) -> WebTask:
    if fmt == "webtask":
        try:
            return WebTask.from_dict(record)
        except TypeError as exc:
            raise TaskError(f"{where}: {exc}") from None
    if fmt == "online-mind2web":
        url = _text(record, "website", where)
        return WebTask(
            task_id=_text(record, "task_id", where),
            instruction=_text(record, "confirmed_task", where),
            start_url=url,
            source="online-mind2web",
            website=_host(url),
            level=str(record["level"]) if record.get("level") is not None else None,
            extra=dict(record),
        )
    # webvoyager / deepshop
    url = _text(record, "web", where)
    level = record.get("difficulty") if fmt == "deepshop" else None
    return WebTask(
        task_id=_text(record, "id", where),
        instruction=_text(record, "ques", where),
        start_url=url,
        source=fmt,
        website=str(record.get("web_name") or _host(url)),
        level=str(level) if level else None,
        extra=dict(record),
    )


def attach_webvoyager_answers(tasks: list[WebTask], answers: str | os.PathLike[str]) -> int:
    """Set ``reference_answer`` (and ``extra["answer_type"]``: golden/possible) from WebVoyager's
    ``reference_answer.json``; returns how many tasks got one. Task ids are ``<web_name>--<id>``."""
    path = Path(answers)
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, json.JSONDecodeError) as exc:
        raise TaskError(f"{path}: cannot read reference answers: {exc}") from None
    if not isinstance(data, dict):
        raise TaskError(
            f"{path}: expected {{web_name: {{answers: [...]}}}}, got {type(data).__name__}"
        )
    table: dict[str, dict[str, Any]] = {}
    for web_name, entry in data.items():
        items = entry.get("answers") if isinstance(entry, dict) else None
        if not isinstance(items, list):
            raise TaskError(f"{path}: {web_name!r} has no 'answers' list")
        for item in items:
            if not isinstance(item, dict) or "id" not in item or "ans" not in item:
                raise TaskError(
                    f"{path}: {web_name!r}: answer entries need 'id' and 'ans': {item!r}"
                )
            table[f"{web_name}--{item['id']}"] = item
    count = 0
    for task in tasks:
        item = table.get(task.task_id)
        if item is not None:
            task.reference_answer = str(item["ans"])
            task.extra["answer_type"] = item.get("type")
            count += 1
    return count

"""Helpers the templates share: the template registry, bash snippets, names and formats."""

from __future__ import annotations

import json
import random
import shlex
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from orchard_claw.tasks.schema import ClawTask, TaskError

__all__ = [
    "FIRST_NAMES",
    "TEMPLATES",
    "Template",
    "first_solvable",
    "http_calls",
    "jdump",
    "money",
    "parse_money",
    "register_template",
    "write_file",
]

FIRST_NAMES = (
    "Ana",
    "Ben",
    "Chen",
    "Dana",
    "Eli",
    "Farah",
    "Goran",
    "Hana",
    "Ivo",
    "Jun",
    "Kira",
    "Luis",
    "Mei",
    "Nils",
    "Omar",
    "Priya",
    "Rosa",
    "Sven",
    "Tariq",
    "Uma",
)


@attrs.define(frozen=True)
class Template:
    """A task template: ``make(rng, task_id)`` builds a fresh task of ``kind``."""

    name: str
    kind: str
    make: Callable[[random.Random, str], ClawTask]
    summary: str


TEMPLATES: dict[str, Template] = {}
"""The registered templates by name."""


def register_template(
    name: str, kind: str, summary: str
) -> Callable[[Callable[[random.Random, str], ClawTask]], Callable[[random.Random, str], ClawTask]]:
    """Decorator: register a task maker as template ``name``."""

    def wrap(
        fn: Callable[[random.Random, str], ClawTask],
    ) -> Callable[[random.Random, str], ClawTask]:
        TEMPLATES[name] = Template(name=name, kind=kind, make=fn, summary=summary)
        return fn

    return wrap


def first_solvable(
    attempt: Callable[[random.Random, str], ClawTask | None],
    rng: random.Random,
    task_id: str,
    tries: int = 200,
) -> ClawTask:
    """The first task ``attempt`` makes (it returns ``None`` for a draw it rejects: no
    solution, or one too easy); ``TaskError`` after ``tries`` rejections."""
    for _ in range(tries):
        task = attempt(rng, task_id)
        if task is not None:
            return task
    raise TaskError(f"{task_id}: no acceptable draw in {tries} tries")


def jdump(obj: Any) -> str:
    """Pretty JSON with a final newline (how seeded JSON files look)."""
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def money(value: float) -> str:
    """``1234.5`` -> ``"1234.50"``."""
    return f"{value:.2f}"


def parse_money(text: str) -> float | None:
    """``"1,234.50"`` / ``"$1234.5"`` / ``"EUR 12"`` -> float, else ``None``."""
    cleaned = text.strip().replace(",", "").lstrip("$€£").removeprefix("EUR").strip()
    try:
        return float(cleaned)
    except ValueError:
        return None


def write_file(path: str, content: str) -> str:
    """A bash snippet that writes ``content`` to ``path`` (parents created)."""
    marker = "ORCHARD_EOF"
    while marker in content:
        marker += "_"
    parent = path.rsplit("/", 1)[0] if "/" in path else "."
    body = content if content.endswith("\n") else content + "\n"
    return (
        f"mkdir -p {shlex.quote(parent)}\ncat > {shlex.quote(path)} <<'{marker}'\n{body}{marker}\n"
    )


def http_calls(port: int, calls: Iterable[tuple[str, str, Any]]) -> str:
    """A bash snippet that sends ``(method, path, json body)`` requests to the task service
    with python3's urllib, failing on any non-2xx answer."""
    lines = [
        "python3 - <<'ORCHARD_PY'",
        "import json, urllib.request",
        f"CALLS = {json.dumps(list(calls))}",
        "for method, path, body in CALLS:",
        "    data = None if body is None else json.dumps(body).encode()",
        f"    req = urllib.request.Request('http://127.0.0.1:{port}' + path, data=data, method=method,",
        "                                 headers={'Content-Type': 'application/json'})",
        "    urllib.request.urlopen(req, timeout=10).read()",
        "ORCHARD_PY",
    ]
    return "\n".join(lines) + "\n"

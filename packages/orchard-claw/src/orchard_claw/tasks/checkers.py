"""Checkers by name: host-side functions over a task's final state (``FinalState``).

A checker is ``(task, state) -> CheckResult``, registered with ``@register_checker(name)``;
``ClawTask.checker`` names it and ``ClawTask.expect`` holds its expectations. The templates
(``orchard_claw.tasks.templates``) register one checker each. ``Checks`` collects named
sub-checks into a ``CheckResult`` (passed = all held, score = share held).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs

from orchard_claw.tasks.schema import CheckResult, ClawTask, TaskError

__all__ = [
    "CHECKERS",
    "Checker",
    "Checks",
    "FinalState",
    "get_checker",
    "register_checker",
]


@attrs.define
class FinalState:
    """What a checker sees: a local copy of ``/workspace`` and the service's final state.

    ``service`` is ``None`` when the task has no service or it no longer answers.
    """

    root: Path
    service: dict[str, list[dict[str, Any]]] | None = None

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` (relative to ``/workspace``) is a file."""
        return (self.root / rel).is_file()

    def text(self, rel: str) -> str | None:
        """The text of ``rel``, or ``None`` if it is missing or not UTF-8."""
        try:
            return (self.root / rel).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def json(self, rel: str) -> Any:
        """The parsed JSON of ``rel``, or ``None`` if missing or invalid."""
        raw = self.text(rel)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return None

    def csv_rows(self, rel: str) -> list[dict[str, str]] | None:
        """The rows of a CSV file with a header (cells stripped), or ``None``."""
        raw = self.text(rel)
        if raw is None:
            return None
        try:
            rows = list(csv.DictReader(io.StringIO(raw)))
        except csv.Error:
            return None
        return [
            {(k or "").strip(): (v or "").strip() for k, v in row.items() if k is not None}
            for row in rows
        ]

    def files(self, under: str = "") -> list[str]:
        """Every file below ``under`` (paths relative to ``/workspace``, sorted)."""
        base = self.root / under
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file())

    def read_files(self, under: str) -> Iterator[tuple[str, str]]:
        """``(path, text)`` of every UTF-8 file below ``under``."""
        for rel in self.files(under):
            raw = self.text(rel)
            if raw is not None:
                yield rel, raw


class Checks:
    """Named sub-checks gathered into one ``CheckResult``."""

    def __init__(self) -> None:
        self._items: list[tuple[bool, str]] = []

    def add(self, ok: bool, what: str) -> bool:
        """Record a check (``what`` says what should hold); returns ``ok``."""
        self._items.append((bool(ok), what))
        return bool(ok)

    def result(self) -> CheckResult:
        """All held -> passed; the score is the share that held (0 without checks)."""
        if not self._items:
            return CheckResult(passed=False, score=0.0, details=["FAIL: nothing was checked"])
        held = sum(ok for ok, _ in self._items)
        return CheckResult(
            passed=held == len(self._items),
            score=held / len(self._items),
            details=[f"{'ok' if ok else 'FAIL'}: {what}" for ok, what in self._items],
        )


Checker = Callable[[ClawTask, FinalState], CheckResult]
CHECKERS: dict[str, Checker] = {}
"""The registered checkers by name."""


def register_checker(name: str) -> Callable[[Checker], Checker]:
    """Decorator: register ``fn`` as checker ``name`` (a second registration is an error)."""

    def wrap(fn: Checker) -> Checker:
        if name in CHECKERS and CHECKERS[name] is not fn:
            raise ValueError(f"checker {name!r} is already registered")
        CHECKERS[name] = fn
        return fn

    return wrap


def get_checker(name: str) -> Checker:
    """The checker registered as ``name`` (``TaskError`` if none)."""
    from orchard_claw.tasks import templates  # noqa: F401  (registers the built-in checkers)

    try:
        return CHECKERS[name]
    except KeyError:
        raise TaskError(f"no checker named {name!r}; known: {sorted(CHECKERS)}") from None

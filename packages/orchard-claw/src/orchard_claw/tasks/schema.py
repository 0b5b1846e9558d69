"""The task record: ``ClawTask`` (with its ``Service``), the checker's ``CheckResult``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["KINDS", "WORKSPACE", "CheckResult", "ClawTask", "Service", "TaskError"]

KINDS = ("file_organisation", "email", "scheduling", "data_lookup", "tool_chain")
"""What a task exercises (``ClawTask.kind``)."""

WORKSPACE = "/workspace"
"""Where a task's files live inside the sandbox (``ClawTask.files`` paths are relative to it)."""


class TaskError(ValueError):
    """A task spec, file or record that cannot be loaded or set up (the message says why)."""


@attrs.define(kw_only=True)
class Service:
    """A small JSON records API the task needs, run inside the sandbox on ``127.0.0.1:port``.

    ``collections`` is its initial state: collection name -> list of records (each with an
    ``id``). The shipped server (``data/service.py``, stdlib only) serves ``GET /<c>``
    (``?field=value`` filters), ``GET|PUT|PATCH|DELETE /<c>/<id>`` and ``POST /<c>``; the
    checker reads its final state back with ``GET /_state``. ``docs`` is what the agent is
    told about it (written to ``/workspace/API.md``).
    """

    name: str
    port: int = 8765
    collections: dict[str, list[dict[str, Any]]] = attrs.field(factory=dict)
    docs: str = ""


@attrs.define(kw_only=True)
class CheckResult:
    """A checker's verdict: ``passed`` only when every check holds; ``score`` the share that
    held (0..1); ``details`` one line a check (``ok: ...`` / ``FAIL: ...``)."""

    passed: bool
    score: float
    details: list[str] = attrs.field(factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return attrs.asdict(self)


@attrs.define(kw_only=True)
class ClawTask:
    """One assistant task: what the user asks, the seeded workspace, and how it is graded.

    ``files`` maps paths relative to ``/workspace`` to their text. ``checker`` names a
    registered checker (``orchard_claw.tasks.checkers``) that reads ``expect`` (hidden from
    the agent) and the final sandbox state. ``reference`` is a bash script, run in
    ``/workspace``, that solves the task. ``rubric`` is optional guidance for an LLM grader.
    ``meta`` records provenance (template, seed).
    """

    id: str
    kind: str
    instruction: str
    files: dict[str, str] = attrs.field(factory=dict)
    service: Service | None = None
    checker: str
    expect: dict[str, Any] = attrs.field(factory=dict)
    reference: str
    rubric: str | None = None
    meta: dict[str, Any] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if not self.id or any(c.isspace() or c == "/" for c in self.id):
            raise TaskError(f"task id {self.id!r}: non-empty, without spaces or '/'")
        if self.kind not in KINDS:
            raise TaskError(f"task {self.id}: kind {self.kind!r} is not one of {KINDS}")
        for path in self.files:
            parts = path.split("/")
            if path.startswith("/") or ".." in parts or "" in parts:
                raise TaskError(f"task {self.id}: file path {path!r} must be relative, no '..'")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``from_dict`` reads it back)."""
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "task") -> ClawTask:
        """Read ``to_dict``'s form; unknown or missing keys are an error naming ``where``."""
        names = {f.name for f in attrs.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise TaskError(f"{where}: unknown field(s) {unknown}; known: {sorted(names)}")
        missing = [n for n in ("id", "kind", "instruction", "checker", "reference") if n not in d]
        if missing:
            raise TaskError(f"{where}: missing field(s) {missing}")
        kwargs = dict(d)
        service = kwargs.get("service")
        if service is not None:
            if not isinstance(service, Mapping):
                raise TaskError(f"{where}: 'service' must be an object")
            try:
                kwargs["service"] = Service(**service)
            except TypeError as exc:
                raise TaskError(f"{where}: service: {exc}") from None
        files = kwargs.get("files", {})
        if not isinstance(files, Mapping) or not all(isinstance(v, str) for v in files.values()):
            raise TaskError(f"{where}: 'files' must map paths to text")
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise TaskError(f"{where}: {exc}") from None

"""One trajectory record for every Orchard recipe (SWE, GUI, Claw), stored as JSON lines.

A :class:`Trajectory` is an episode: the OpenAI-style conversation (``messages``), the tool
specs offered (``tools``), the environment steps taken (``steps``: each action and what was
observed after it, large observations such as screenshots stored as files beside the JSONL
and referenced as :class:`Artifact`), token ids where the inference server returned them
(``token_ids``) and a :class:`TrajectoryMetadata` record (task, harness, model, how the
episode ended, usage, timings, final output, reward and verdict).

Files are JSON lines: :func:`append_jsonl` writes one record per line and fsyncs it, so a
crash loses at most the line being written; :func:`iter_jsonl` skips a torn line with a
warning. Every record carries ``schema`` (:data:`SCHEMA`); files written by older
versions (``orchard-swe-trajectory/1``) load into the current form.

Images inside ``messages`` reference artifacts as ``{"type": "image_url", "image_url":
{"url": "artifact:<path>"}}``; :func:`inline_artifacts` turns them into ``data:`` URLs for a
model or a trainer.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Final

import attrs

__all__ = [
    "ARTIFACT_URL_PREFIX",
    "FORMAT_ERROR",
    "SCHEMA",
    "STEP_LIMIT",
    "SUBMITTED",
    "TIME_LIMIT",
    "Artifact",
    "ArtifactWriter",
    "Trajectory",
    "TrajectoryMetadata",
    "TrajectoryStep",
    "TurnTokens",
    "append_jsonl",
    "artifact_path",
    "artifact_url",
    "error_status",
    "inline_artifacts",
    "iter_jsonl",
    "read_jsonl",
]

SCHEMA: Final = "orchard-trajectory/2"
"""Value of the ``schema`` key of a serialised trajectory."""
_LEGACY_SWE_SCHEMA: Final = "orchard-swe-trajectory/1"

SUBMITTED: Final = "submitted"
"""The agent declared the task finished (SWE: submitted a patch; GUI: ``done``)."""
STEP_LIMIT: Final = "step_limit"
TIME_LIMIT: Final = "time_limit"
FORMAT_ERROR: Final = "format_error"
"""The model kept answering without a usable action."""

ARTIFACT_URL_PREFIX: Final = "artifact:"
"""Prefix of an image URL inside ``messages`` that names an artifact file."""


def error_status(exc: BaseException | str) -> str:
    """The ``exit_status`` of an episode that ended with an error: ``"error: <what>"``."""
    what = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    what = " ".join(what.split())
    return f"error: {what[:500]}"


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in attrs.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@attrs.define(kw_only=True, frozen=True)
class Artifact:
    """A file stored beside the JSONL (a screenshot, a log), referenced by path."""

    path: str
    """Relative to the directory of the JSONL file, ``/``-separated."""
    media_type: str = "image/png"
    sha256: str = ""
    size: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Artifact:
        """Build from :meth:`to_dict` output; unknown keys are ignored."""
        return cls(**_known(cls, data))


@attrs.define(kw_only=True)
class TrajectoryStep:
    """One environment step: the action taken and what was observed after it.

    Index 0 may hold the first observation (``action`` None), before any action.
    """

    index: int
    action: dict[str, Any] | None = None
    """The action as the environment received it (GUI: ``{"action": "click", ...}``)."""
    observation: dict[str, Any] = attrs.field(factory=dict)
    """Small text fields observed after the action (URL, title, command output, ...)."""
    artifacts: dict[str, Artifact] = attrs.field(factory=dict)
    """Large observations by reference, by name (e.g. ``"screenshot"``)."""
    message_index: int | None = None
    """The assistant message in ``messages`` that chose this action."""
    reward: float | None = None
    error: str | None = None
    """The action failed in the environment (it still ran; the episode went on)."""
    extra: dict[str, Any] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = attrs.asdict(self, recurse=False)
        out["artifacts"] = {k: a.to_dict() for k, a in self.artifacts.items()}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrajectoryStep:
        """Build from :meth:`to_dict` output; unknown keys are ignored."""
        fields = _known(cls, data)
        fields["artifacts"] = {
            str(k): Artifact.from_dict(v) for k, v in (data.get("artifacts") or {}).items()
        }
        return cls(**fields)


@attrs.define(kw_only=True)
class TurnTokens:
    """The token ids of one model call, where the inference server returned them."""

    message_index: int
    """The assistant message this call produced."""
    prompt_ids: list[int] = attrs.field(factory=list)
    completion_ids: list[int] = attrs.field(factory=list)
    logprobs: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TurnTokens:
        """Build from :meth:`to_dict` output; unknown keys are ignored."""
        return cls(**_known(cls, data))


@attrs.define(kw_only=True)
class TrajectoryMetadata:
    """What one episode was and how it ended; ``reward``/``verdict`` may come later
    (grading, a judge)."""

    task_id: str
    recipe: str = ""
    """``"swe"``, ``"gui"``, ``"claw"``, ..."""
    harness: str = ""
    model: str = ""
    attempt: int = 0
    exit_status: str = ""
    """``submitted``, ``step_limit``, ``time_limit``, ``format_error``, a recipe's own
    (SWE: ``cost_limit``) or ``error: ...``."""
    steps: int = 0
    """Model calls made (a reply without a usable action counts too)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    started_at: float = 0.0
    """Unix time."""
    finished_at: float = 0.0
    """Unix time."""
    duration_s: float = 0.0
    final_output: str = ""
    """What the episode produced: SWE's final patch, a GUI agent's answer."""
    reward: float | None = None
    verdict: str | None = None
    """The grader's or judge's word (SWE: ``resolved``...; GUI: ``success``/``failure``)."""
    error: str | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return attrs.asdict(self, recurse=False) | {"extra": dict(self.extra)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrajectoryMetadata:
        """Build from :meth:`to_dict` output; unknown keys are ignored."""
        return cls(**_known(cls, data))


def _upgrade_swe_v1(data: Mapping[str, Any]) -> dict[str, Any]:
    """An ``orchard-swe-trajectory/1`` record in the current form."""
    meta = dict(data.get("metadata") or {})
    meta.setdefault("task_id", meta.pop("instance_id", ""))
    meta.setdefault("final_output", meta.pop("final_patch", ""))
    meta.setdefault("verdict", meta.pop("verify_status", None))
    meta.setdefault("recipe", "swe")
    return {**data, "schema": SCHEMA, "metadata": meta}


def _schema_version(schema: str) -> int:
    prefix = SCHEMA.rsplit("/", 1)[0] + "/"
    if not schema.startswith(prefix) or not schema[len(prefix) :].isdigit():
        raise ValueError(f"not an Orchard trajectory (schema={schema!r})")
    return int(schema[len(prefix) :])


@attrs.define(kw_only=True)
class Trajectory:
    """An episode (see the module doc)."""

    metadata: TrajectoryMetadata
    messages: list[dict[str, Any]] = attrs.field(factory=list)
    tools: list[dict[str, Any]] = attrs.field(factory=list)
    steps: list[TrajectoryStep] = attrs.field(factory=list)
    token_ids: list[TurnTokens] = attrs.field(factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``schema`` first)."""
        return {
            "schema": SCHEMA,
            "metadata": self.metadata.to_dict(),
            "messages": [dict(m) for m in self.messages],
            "tools": [dict(t) for t in self.tools],
            "steps": [s.to_dict() for s in self.steps],
            "token_ids": [t.to_dict() for t in self.token_ids],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trajectory:
        """Build from :meth:`to_dict` output of this or an older version."""
        schema = str(data.get("schema", SCHEMA))
        if schema == _LEGACY_SWE_SCHEMA:
            data = _upgrade_swe_v1(data)
        elif _schema_version(schema) > _schema_version(SCHEMA):
            raise ValueError(
                f"trajectory schema {schema!r} is newer than this reader ({SCHEMA}); "
                "upgrade orchard-env-client"
            )
        return cls(
            metadata=TrajectoryMetadata.from_dict(data["metadata"]),
            messages=[dict(m) for m in data.get("messages") or []],
            tools=[dict(t) for t in data.get("tools") or []],
            steps=[TrajectoryStep.from_dict(s) for s in data.get("steps") or []],
            token_ids=[TurnTokens.from_dict(t) for t in data.get("token_ids") or []],
        )

    def to_json(self) -> str:
        """One line of compact JSON."""
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Trajectory:
        """Parse :meth:`to_json` output."""
        return cls.from_dict(json.loads(text))

    def assistant_messages(self) -> list[dict[str, Any]]:
        """The assistant turns, in order."""
        return [m for m in self.messages if m.get("role") == "assistant"]


# ---------------------------------------------------------------- JSON lines

_APPEND_LOCK = threading.Lock()


def append_jsonl(path: str | os.PathLike[str], traj: Trajectory) -> None:
    """Append ``traj`` to ``path`` as one line, flushed and fsync'd before returning.

    A crash loses at most the line being written. If an earlier crash left a torn last
    line (no trailing newline), a newline is written first so the new record stays whole.
    Appends from threads of one process are serialised.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    line = (traj.to_json() + "\n").encode("utf-8")
    with _APPEND_LOCK, open(target, "ab+") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                line = b"\n" + line
            fh.seek(0, os.SEEK_END)
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def iter_jsonl(path: str | os.PathLike[str], *, strict: bool = False) -> Iterator[Trajectory]:
    """Yield the trajectories of a JSON-lines file, skipping torn lines with a warning.

    A torn line is one that does not parse (a crash mid-write). With ``strict``, only the
    last line may be torn; a bad line elsewhere raises ``ValueError``.
    """
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")
    last = max((i for i, raw in enumerate(lines) if raw.strip()), default=-1)
    for number, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if strict and number != last:
                raise ValueError(f"{path}:{number + 1}: corrupt line: {exc}") from exc
            warnings.warn(
                f"{path}:{number + 1}: skipping a torn or corrupt line ({exc})",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        yield Trajectory.from_dict(data)


def read_jsonl(path: str | os.PathLike[str], *, strict: bool = False) -> list[Trajectory]:
    """All trajectories of a JSON-lines file (see :func:`iter_jsonl`)."""
    return list(iter_jsonl(path, strict=strict))


# ---------------------------------------------------------------- artifacts


def _safe_relative(path: str) -> PurePosixPath:
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise ValueError(f"an artifact path must be relative and stay inside: {path!r}")
    return rel


class ArtifactWriter:
    """Writes an episode's artifact files under ``<jsonl_dir>/<subdir>/``.

    Each write goes to a temporary name and is renamed into place, so a reader never
    sees half a file; the returned :class:`Artifact` carries its size and sha256.
    """

    def __init__(self, jsonl_dir: str | os.PathLike[str], subdir: str) -> None:
        self.root = Path(jsonl_dir)
        self.subdir = _safe_relative(subdir)

    def write(self, name: str, data: bytes, media_type: str = "image/png") -> Artifact:
        """Store ``data`` as ``<subdir>/<name>`` and return its reference."""
        rel = self.subdir / _safe_relative(name)
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        return Artifact(
            path=str(rel),
            media_type=media_type,
            sha256=hashlib.sha256(data).hexdigest(),
            size=len(data),
        )


def artifact_path(jsonl_dir: str | os.PathLike[str], artifact: Artifact | str) -> Path:
    """Where an artifact (or an ``artifact:`` URL's path) lives on disk."""
    raw = artifact.path if isinstance(artifact, Artifact) else artifact
    raw = raw.removeprefix(ARTIFACT_URL_PREFIX)
    return Path(jsonl_dir) / _safe_relative(raw)


def artifact_url(artifact: Artifact) -> str:
    """The ``artifact:`` URL that names ``artifact`` inside a message's image part."""
    return ARTIFACT_URL_PREFIX + artifact.path


def inline_artifacts(
    messages: Sequence[Mapping[str, Any]], jsonl_dir: str | os.PathLike[str]
) -> list[dict[str, Any]]:
    """A copy of ``messages`` with every ``artifact:`` image URL replaced by a ``data:`` URL.

    A missing file raises ``FileNotFoundError`` naming it (never a silently dropped image).
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        copy = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                url = (
                    (part.get("image_url") or {}).get("url") if isinstance(part, Mapping) else None
                )
                if isinstance(url, str) and url.startswith(ARTIFACT_URL_PREFIX):
                    file = artifact_path(jsonl_dir, url)
                    media = _media_type(file)
                    encoded = base64.b64encode(file.read_bytes()).decode("ascii")
                    part = {
                        **part,
                        "image_url": {**part["image_url"], "url": f"data:{media};base64,{encoded}"},
                    }
                parts.append(part)
            copy["content"] = parts
        out.append(copy)
    return out


def _media_type(path: Path) -> str:
    return {
        ".png": "image/png",
        ".jpg": "image/jpeg",
        ".jpeg": "image/jpeg",
        ".webp": "image/webp",
    }.get(path.suffix.lower(), "application/octet-stream")

"""One trajectory schema for every SWE harness, stored as JSON lines.

A :class:`Trajectory` is an OpenAI-style conversation (``messages``), the tool specs that
were offered (``tools``, empty for text-based harnesses such as mini-swe-agent's backticks
config) and a :class:`TrajectoryMetadata` record (instance, harness, model, limits hit,
usage, timings, the final patch and, later, the grading verdict).

Files of trajectories are JSON lines: :func:`append_jsonl` writes one record per line and
fsyncs it, so a crash loses at most the line being written; :func:`read_jsonl` skips a torn
line with a warning. :func:`from_mini_traj` converts the ``.traj.json`` that
mini-swe-agent v2's ``DefaultAgent.save`` writes.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import attrs

__all__ = [
    "COST_LIMIT",
    "FORMAT_ERROR",
    "SCHEMA",
    "STEP_LIMIT",
    "SUBMITTED",
    "TIME_LIMIT",
    "Trajectory",
    "TrajectoryMetadata",
    "append_jsonl",
    "error_status",
    "from_mini_traj",
    "iter_jsonl",
    "mini_exit_status",
    "read_jsonl",
]

SCHEMA: Final = "orchard-swe-trajectory/1"
"""Value of the ``schema`` key of a serialised trajectory."""

SUBMITTED: Final = "submitted"
STEP_LIMIT: Final = "step_limit"
COST_LIMIT: Final = "cost_limit"
TIME_LIMIT: Final = "time_limit"
FORMAT_ERROR: Final = "format_error"

_MESSAGE_KEYS: Final = (
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "name",
    "reasoning_content",
)


def error_status(exc: BaseException | str) -> str:
    """The ``exit_status`` of an episode that ended with an error: ``"error: <what>"``."""
    what = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    what = " ".join(what.split())
    return f"error: {what[:500]}"


@attrs.define(kw_only=True)
class TrajectoryMetadata:
    """What one episode was and how it ended; ``verify_status`` is filled in by grading."""

    instance_id: str
    harness: str
    """``"mini"`` or ``"tools"``."""
    model: str
    attempt: int = 0
    exit_status: str = ""
    """``submitted``, ``step_limit``, ``cost_limit``, ``time_limit``, ``format_error`` or
    ``error: ...``."""
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
    final_patch: str = ""
    verify_status: str | None = None
    error: str | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return attrs.asdict(self, recurse=False) | {"extra": dict(self.extra)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrajectoryMetadata:
        """Build from :meth:`to_dict` output; unknown keys are ignored."""
        names = {f.name for f in attrs.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@attrs.define(kw_only=True)
class Trajectory:
    """An episode: OpenAI-style ``messages``, the ``tools`` offered, and ``metadata``."""

    metadata: TrajectoryMetadata
    messages: list[dict[str, Any]] = attrs.field(factory=list)
    tools: list[dict[str, Any]] = attrs.field(factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``schema``, ``metadata``, ``messages``, ``tools``)."""
        return {
            "schema": SCHEMA,
            "metadata": self.metadata.to_dict(),
            "messages": [dict(m) for m in self.messages],
            "tools": [dict(t) for t in self.tools],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trajectory:
        """Build from :meth:`to_dict` output."""
        schema = data.get("schema", SCHEMA)
        if not str(schema).startswith("orchard-swe-trajectory/"):
            raise ValueError(f"not an orchard-swe trajectory (schema={schema!r})")
        return cls(
            metadata=TrajectoryMetadata.from_dict(data["metadata"]),
            messages=[dict(m) for m in data.get("messages", [])],
            tools=[dict(t) for t in data.get("tools", [])],
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


# ---------------------------------------------------------------- mini-swe-agent

_MINI_EXIT_STATUS: Final = {
    "Submitted": SUBMITTED,
    "TimeExceeded": TIME_LIMIT,
    "RepeatedFormatError": FORMAT_ERROR,
    "FormatError": FORMAT_ERROR,
}


def mini_exit_status(
    raw: str, *, steps: int, step_limit: int, cost: float, cost_limit: float
) -> str:
    """Map a mini-swe-agent ``exit_status`` to ours (``LimitsExceeded`` splits in two)."""
    if raw in _MINI_EXIT_STATUS:
        return _MINI_EXIT_STATUS[raw]
    if raw == "LimitsExceeded":
        if 0 < step_limit <= steps:
            return STEP_LIMIT
        if 0 < cost_limit <= cost:
            return COST_LIMIT
        return STEP_LIMIT
    if not raw:
        return error_status("the agent ended without an exit status")
    return error_status(raw)


def _normalise_tool_calls(calls: Any) -> list[dict[str, Any]] | None:
    if not calls:
        return None
    out = []
    for call in calls:
        fn = call.get("function") or {}
        arguments = fn.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        out.append(
            {
                "id": call.get("id") or "",
                "type": call.get("type") or "function",
                "function": {"name": fn.get("name") or "", "arguments": arguments},
            }
        )
    return out


def _openai_message(msg: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _MESSAGE_KEYS:
        value = msg.get(key)
        if key == "tool_calls":
            value = _normalise_tool_calls(value)
        if value is not None or key == "content":
            out[key] = value
    return out


def _usage_of(msg: Mapping[str, Any]) -> tuple[int, int]:
    response = (msg.get("extra") or {}).get("response")
    usage = response.get("usage") if isinstance(response, Mapping) else None
    if not isinstance(usage, Mapping):
        return 0, 0
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def _mini_bash_tool_spec() -> dict[str, Any]:
    try:  # the spec mini's tool-calling models offer; imported lazily (mini is heavy)
        from minisweagent.models.utils.actions_toolcall import BASH_TOOL
    except ImportError:  # pragma: no cover - mini is a dependency
        return {"type": "function", "function": {"name": "bash"}}
    return dict(BASH_TOOL)


def from_mini_traj(
    data_or_path: Mapping[str, Any] | str | os.PathLike[str],
    *,
    instance_id: str | None = None,
    attempt: int = 0,
    model: str | None = None,
) -> Trajectory:
    """Convert mini-swe-agent v2's ``.traj.json`` (a dict, or a path to one) to a Trajectory.

    mini's messages keep their raw ``content`` (a text-based config's THOUGHT and fenced
    bash block stay as written); mini's per-message ``extra`` is dropped, except that
    usage is summed from each model response. mini's final ``exit`` message is not an
    OpenAI role: its status and submission go to ``metadata.extra["mini"]``. Tool specs
    are ``[]`` for text-based models and mini's ``bash`` tool for tool-calling ones.
    ``final_patch`` is mini's submission (the harness replaces it with the sandbox diff).
    """
    if isinstance(data_or_path, Mapping):
        data: Mapping[str, Any] = data_or_path
    else:
        data = json.loads(Path(data_or_path).read_text(encoding="utf-8"))
    info: Mapping[str, Any] = data.get("info") or {}
    config: Mapping[str, Any] = info.get("config") or {}
    agent_cfg: Mapping[str, Any] = config.get("agent") or {}
    model_cfg: Mapping[str, Any] = config.get("model") or {}
    stats: Mapping[str, Any] = info.get("model_stats") or {}
    raw_messages: list[Mapping[str, Any]] = list(data.get("messages") or [])

    messages: list[dict[str, Any]] = []
    exit_messages: list[Mapping[str, Any]] = []
    prompt_tokens = completion_tokens = 0
    timestamps: list[float] = []
    for msg in raw_messages:
        extra = msg.get("extra") or {}
        if isinstance(extra.get("timestamp"), int | float):
            timestamps.append(float(extra["timestamp"]))
        if msg.get("role") == "exit":
            exit_messages.append(msg)
            continue
        if msg.get("role") == "assistant":
            p, c = _usage_of(msg)
            prompt_tokens += p
            completion_tokens += c
        messages.append(_openai_message(msg))
    # a reply that failed to parse is stored by mini on the format-error message only
    for msg in raw_messages:
        extra = msg.get("extra") or {}
        if extra.get("interrupt_type") == "FormatError":
            p, c = _usage_of(msg)
            prompt_tokens += p
            completion_tokens += c

    steps = int(stats.get("api_calls") or sum(m.get("role") == "assistant" for m in messages))
    cost = float(stats.get("instance_cost") or 0.0)
    raw_status = str(info.get("exit_status") or "")
    exit_extra: Mapping[str, Any] = (exit_messages[-1].get("extra") or {}) if exit_messages else {}
    if not raw_status:
        raw_status = str(exit_extra.get("exit_status") or "")
    exception_str = str(info.get("exception_str") or exit_extra.get("exception_str") or "")
    exit_status = mini_exit_status(
        raw_status,
        steps=steps,
        step_limit=int(agent_cfg.get("step_limit") or 0),
        cost=cost,
        cost_limit=float(agent_cfg.get("cost_limit") or 0.0),
    )
    model_type = str(config.get("model_type") or "")
    uses_tools = any(m.get("tool_calls") for m in messages) or (
        bool(model_type) and "textbased" not in model_type.lower()
    )
    started = timestamps[0] if timestamps else 0.0
    finished = timestamps[-1] if timestamps else 0.0
    if exit_status.startswith("error") and exception_str:
        exit_status = error_status(f"{raw_status or 'error'}: {exception_str}")
    error = None
    if exit_status.startswith("error"):
        error = exception_str or raw_status or exit_status
    mini_extra: dict[str, Any] = {
        "exit_status": raw_status,
        "submission": info.get("submission") or "",
        "mini_version": info.get("mini_version"),
        "model_type": model_type or None,
        "model_name": model_cfg.get("model_name"),
        "trajectory_format": data.get("trajectory_format"),
    }
    if info.get("traceback") or exit_extra.get("traceback"):
        mini_extra["traceback"] = info.get("traceback") or exit_extra.get("traceback")
    metadata = TrajectoryMetadata(
        instance_id=str(instance_id or data.get("instance_id") or ""),
        harness="mini",
        model=str(model or model_cfg.get("model_name") or ""),
        attempt=attempt,
        exit_status=exit_status,
        steps=steps,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cost=cost,
        started_at=started,
        finished_at=finished,
        duration_s=max(0.0, finished - started),
        final_patch=str(info.get("submission") or ""),
        error=error,
        extra={"mini": mini_extra},
    )
    tools = [_mini_bash_tool_spec()] if uses_tools else []
    return Trajectory(metadata=metadata, messages=messages, tools=tools)

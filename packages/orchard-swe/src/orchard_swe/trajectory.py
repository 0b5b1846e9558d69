"""The SWE recipe's side of the trajectory contract.

The record itself (:class:`Trajectory`, its metadata, JSON-lines I/O) is recipe-neutral and
lives in :mod:`orchard_env_client.trajectory`; it is re-exported here. What is SWE's own:
:data:`COST_LIMIT`; :func:`from_mini_traj`, which converts the ``.traj.json`` that
mini-swe-agent v2's ``DefaultAgent.save`` writes; and :func:`read_trajectories`, the one
reader of trajectory files given as input (a JSON Lines file or a directory of them),
whose line reader :func:`read_json_lines` SFT data shares. A SWE trajectory's ``task_id`` is the
SWE-bench instance id, its ``final_output`` the final patch and its ``verdict`` the
grading status.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from orchard_env_client.trajectory import (
    FORMAT_ERROR,
    SCHEMA,
    STEP_LIMIT,
    SUBMITTED,
    TIME_LIMIT,
    Trajectory,
    TrajectoryMetadata,
    append_jsonl,
    error_status,
    iter_jsonl,
    read_jsonl,
)

__all__ = [
    "COST_LIMIT",
    "FORMAT_ERROR",
    "MESSAGE_KEYS",
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
    "jsonl_files",
    "mini_exit_status",
    "read_json_lines",
    "read_jsonl",
    "read_trajectories",
    "trajectory_from_record",
]

COST_LIMIT: Final = "cost_limit"
"""SWE's own exit status: the episode's model spend reached its limit."""

MESSAGE_KEYS: Final = (
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "name",
    "reasoning_content",
)
"""The chat-message fields a SWE trajectory keeps, in order (``role`` and ``content`` first)."""


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
    for key in MESSAGE_KEYS:
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
        task_id=str(instance_id or data.get("instance_id") or ""),
        recipe="swe",
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
        final_output=str(info.get("submission") or ""),
        error=error,
        extra={"mini": mini_extra},
    )
    tools = [_mini_bash_tool_spec()] if uses_tools else []
    return Trajectory(metadata=metadata, messages=messages, tools=tools)


# ---------------------------------------------------------------- reading input files


def jsonl_files(path: str | os.PathLike[str]) -> list[Path]:
    """The JSON Lines files ``path`` names: itself, or every ``*.jsonl`` under a directory.

    Raises ``FileNotFoundError`` for a missing path or a directory without ``*.jsonl``.
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
        if not files:
            raise FileNotFoundError(f"no .jsonl files under {path}")
        return files
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: {path}")
    return [path]


def read_json_lines(path: str | os.PathLike[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, object)`` for every non-blank line of the files :func:`jsonl_files` finds.

    ``where`` is ``FILE:LINE``. A line that is not JSON, or not a JSON object, raises
    ``ValueError`` naming it.
    """
    for file in jsonl_files(path):
        with open(file, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                where = f"{file}:{number}"
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{where}: not JSON ({exc})") from None
                if not isinstance(data, dict):
                    raise ValueError(f"{where}: not a JSON object")
                yield where, data


def trajectory_from_record(data: Mapping[str, Any], where: str) -> Trajectory:
    """The :class:`Trajectory` of one JSON record; ``ValueError`` naming ``where`` if it is not
    one."""
    if "metadata" not in data:
        raise ValueError(f"{where}: not a trajectory (no schema/metadata)")
    try:
        return Trajectory.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: not a trajectory ({type(exc).__name__}: {exc})") from None


def read_trajectories(path: str | os.PathLike[str]) -> list[Trajectory]:
    """Every trajectory of a JSON Lines file, or of every ``*.jsonl`` under a directory.

    Strict, for input a user names: the first bad line raises ``ValueError`` naming its file
    and line; a missing path, or a directory without ``*.jsonl``, ``FileNotFoundError``.
    (A run's own output, which a crash may have torn, is read with :func:`read_jsonl`.)
    """
    return [trajectory_from_record(data, where) for where, data in read_json_lines(path)]

"""``orchard-swe bar replay``: BAR's decisions for recorded prompts, by either profile.

Reads JSON Lines, one prompt per line::

    {"n": 8, "n_max": 32, "stride": 8, "p_min": 0.25, "p_max": 0.75,
     "samples": [{"reward": 1.0, "status": "completed", "exit_status": null}, ...]}

``samples`` holds every sample the prompt *could* get, in generation order; status is
``completed``, ``truncated`` or ``aborted``, reward ``null`` when missing. Writes one line
per prompt: ``{"generated": int, "selected": [indices into samples], "outcome":
"found" | "relaxed" | "fallback"}``. Pure and fast (no I/O but the streams).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import IO, Any

from . import bar_reference
from .bar import BarConfig, GenerateMore, Profile, Sample, Status, decide_orchard
from .bar_reference import RefSample

__all__ = ["ReplayInputError", "replay_prompt", "replay_stream"]

_STATUSES = ("completed", "truncated", "aborted")


class ReplayInputError(ValueError):
    """A prompt line that is not what the format says."""


def replay_prompt(doc: Mapping[str, Any], profile: Profile) -> dict[str, Any]:
    """One prompt's decision (see the module doc), by ``profile``'s rules."""
    n, n_max, stride = (_int(doc, key) for key in ("n", "n_max", "stride"))
    p_min, p_max = _float(doc, "p_min"), _float(doc, "p_max")
    samples = [_sample(s, i) for i, s in enumerate(_list(doc, "samples"))]
    try:
        if profile == "reference":
            got = bar_reference.replay(samples, n, n_max, stride, p_min, p_max)
            return {"generated": got.generated, "selected": got.selected, "outcome": got.outcome}
        cfg = BarConfig(n=n, n_max=n_max, stride=stride, p_min=p_min, p_max=p_max, profile=profile)
    except ValueError as exc:
        raise ReplayInputError(str(exc)) from None
    return _replay_orchard([_as_ours(s) for s in samples], cfg)


def replay_stream(lines: Iterable[str], out: IO[str], profile: Profile) -> int:
    """Replay every line of ``lines`` into ``out``; the number of prompts. A bad line
    raises ``ReplayInputError`` naming it (the lines before it are already written)."""
    count = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            if not isinstance(doc, dict):
                raise ReplayInputError("not a JSON object")
            answer = replay_prompt(doc, profile)
        except ValueError as exc:  # ReplayInputError and JSON errors alike
            raise ReplayInputError(f"line {number}: {exc}") from None
        out.write(json.dumps(answer, separators=(",", ":")) + "\n")
        count += 1
    return count


def _replay_orchard(samples: list[Sample], cfg: BarConfig) -> dict[str, Any]:
    """Our allocator driven over ``samples``: each request takes the next ones."""
    requested = 0
    while True:
        have = min(requested, len(samples))
        decision = decide_orchard(samples[:have], cfg, requested=requested)
        if isinstance(decision, GenerateMore):
            requested += decision.count
            continue
        return {
            "generated": have,
            "selected": list(decision.indices),
            "outcome": decision.outcome,
        }


def _as_ours(sample: RefSample) -> Sample:
    """Our sample type: a missing reward counts as an aborted sample's."""
    if sample.reward is None or sample.status == "aborted":
        return Sample(sample.reward or 0.0, Status.ABORTED)
    if sample.timed_out:
        return Sample(sample.reward, Status.TIME_EXCEEDED)
    return Sample(sample.reward, Status(sample.status))


def _sample(raw: Any, index: int) -> RefSample:
    if not isinstance(raw, dict):
        raise ReplayInputError(f"samples[{index}] is not an object")
    reward, status, exit_status = raw.get("reward"), raw.get("status"), raw.get("exit_status")
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward)
    ):
        raise ReplayInputError(f"samples[{index}].reward must be a finite number or null")
    if status not in _STATUSES:
        raise ReplayInputError(f"samples[{index}].status must be one of {', '.join(_STATUSES)}")
    if exit_status is not None and not isinstance(exit_status, str):
        raise ReplayInputError(f"samples[{index}].exit_status must be a string or null")
    return RefSample(None if reward is None else float(reward), status, exit_status)


def _int(doc: Mapping[str, Any], key: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReplayInputError(f"{key} must be an integer")
    return value


def _float(doc: Mapping[str, Any], key: str) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ReplayInputError(f"{key} must be a number")
    return float(value)


def _list(doc: Mapping[str, Any], key: str) -> list[Any]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise ReplayInputError(f"{key} must be a list")
    return value

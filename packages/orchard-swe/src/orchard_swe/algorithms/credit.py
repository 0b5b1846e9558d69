"""Credit-assignment SFT: turn partly failed trajectories into supervision.

Turns are the assistant messages of a trajectory, numbered ``0 .. T-1``. An
:class:`Estimator` gives a value curve ``V[0..T]``: ``V[0]`` is the estimated
``P(resolved)`` of the prefix before the first assistant turn and ``V[t+1]`` that of the
prefix through turn ``t`` and the observations after it (up to the next assistant turn).
Turn ``t``'s credit is ``dV[t] = V[t+1] - V[t]``, computed on the (optionally smoothed)
curve.

Rise segments (:func:`rise_segments`), with ``delta > 0`` and ``epsilon >= 0``: a run of
turns ``[a, b)`` is *admissible* when

1. no single drop: ``dV[t] >= -epsilon`` for every ``t`` in ``[a, b)``;
2. cumulative rise: ``V[b] - V[a] >= delta``;
3. it starts and ends on a rising turn: ``dV[a] > 0`` and ``dV[b-1] > 0``.

Segments are chosen greedily: admissible runs sorted by length (longest first), then gain
(largest first), then start (earliest first); a run is taken when it overlaps no run taken
before. So segments never overlap, each is maximal among the admissible runs that avoid the
earlier ones, and every admissible run meets some segment. Segments are returned by start.

:func:`samples_for` builds message-level SFT samples: for a segment, the messages up to its
last assistant turn, with loss 1 on the segment's assistant messages and 0 on everything
else (the full prefix is context); a resolved trajectory stays whole (loss 1 on every
assistant message). See ``docs/swe-training.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

import attrs

from ..trajectory import Trajectory

__all__ = [
    "CreditConfig",
    "Estimator",
    "FixedValues",
    "Segment",
    "SftSample",
    "Smoother",
    "admissible",
    "assistant_positions",
    "credit_samples",
    "deltas",
    "ema",
    "is_resolved",
    "moving_average",
    "rise_segments",
    "samples_for",
    "segment_sample",
    "whole_sample",
]

Smoother = Callable[[Sequence[float]], list[float]]
"""Maps a value curve to a smoothed curve of the same length."""


def ema(alpha: float) -> Smoother:
    """Exponential moving average: ``s[0] = v[0]``, ``s[t] = alpha*v[t] + (1-alpha)*s[t-1]``."""
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")

    def smooth(values: Sequence[float]) -> list[float]:
        out: list[float] = []
        for v in values:
            out.append(v if not out else alpha * v + (1.0 - alpha) * out[-1])
        return out

    return smooth


def moving_average(window: int) -> Smoother:
    """Trailing moving average: ``s[t]`` is the mean of ``v[max(0, t-window+1) .. t]``."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")

    def smooth(values: Sequence[float]) -> list[float]:
        return [
            math.fsum(values[max(0, t - window + 1) : t + 1]) / (t + 1 - max(0, t - window + 1))
            for t in range(len(values))
        ]

    return smooth


def deltas(values: Sequence[float]) -> list[float]:
    """``dV[t] = V[t+1] - V[t]`` for ``t`` in ``0 .. len(values)-2``."""
    return [values[t + 1] - values[t] for t in range(len(values) - 1)]


@attrs.frozen
class Segment:
    """Turns ``start .. stop-1`` (0-based assistant-turn indices) and their gain."""

    start: int
    stop: int
    gain: float = attrs.field(eq=False)

    def __len__(self) -> int:
        return self.stop - self.start


def _check(delta: float, epsilon: float) -> None:
    if not delta > 0.0:
        raise ValueError(f"delta must be > 0, got {delta}")
    if not epsilon >= 0.0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")


def admissible(
    values: Sequence[float], start: int, stop: int, delta: float, epsilon: float
) -> bool:
    """Whether turns ``[start, stop)`` form an admissible run of the (smoothed) curve."""
    if not 0 <= start < stop <= len(values) - 1:
        return False
    d = deltas(values)
    return (
        all(d[t] >= -epsilon for t in range(start, stop))
        and values[stop] - values[start] >= delta
        and d[start] > 0.0
        and d[stop - 1] > 0.0
    )


def rise_segments(
    values: Sequence[float],
    *,
    delta: float,
    epsilon: float,
    smoother: Smoother | None = None,
) -> list[Segment]:
    """The rise segments of a value curve ``V[0..T]`` (see the module docstring for the rule).

    ``smoother`` is applied to ``values`` first; gains and deltas are those of the smoothed
    curve. Raises ``ValueError`` for a non-finite value or a bad ``delta``/``epsilon``.
    """
    _check(delta, epsilon)
    curve = list(smoother(values)) if smoother is not None else [float(v) for v in values]
    if len(curve) != len(values):
        raise ValueError("the smoother changed the curve's length")
    if not all(math.isfinite(v) for v in curve):
        raise ValueError("the value curve has a non-finite value")
    d = deltas(curve)
    candidates: list[tuple[int, float, int]] = []  # (length, gain, start)
    t = 0
    while t < len(d):
        if d[t] < -epsilon:
            t += 1
            continue
        block_end = t
        while block_end < len(d) and d[block_end] >= -epsilon:
            block_end += 1
        rising = [i for i in range(t, block_end) if d[i] > 0.0]
        for x, a in enumerate(rising):
            for b in rising[x:]:
                gain = curve[b + 1] - curve[a]
                if gain >= delta:
                    candidates.append((b + 1 - a, gain, a))
        t = block_end
    candidates.sort(key=lambda c: (-c[0], -c[1], c[2]))
    taken = [False] * len(d)
    segments: list[Segment] = []
    for length, gain, start in candidates:
        if any(taken[start : start + length]):
            continue
        for i in range(start, start + length):
            taken[i] = True
        segments.append(Segment(start, start + length, gain))
    return sorted(segments, key=lambda s: s.start)


# ---------------------------------------------------------------- samples


def assistant_positions(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """The message indices of the assistant turns, in order."""
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant"]


@attrs.frozen
class SftSample:
    """Messages with a per-message loss mask (1: train on it, 0: context only)."""

    messages: tuple[dict[str, Any], ...]
    loss_mask: tuple[int, ...]
    tools: tuple[dict[str, Any], ...]
    kind: Literal["whole", "segment"]
    instance_id: str
    attempt: int
    segment: Segment | None = None

    def to_dict(self) -> dict[str, Any]:
        """OpenAI fine-tuning style: assistant messages carry ``weight`` 0 or 1."""
        messages = []
        for m, w in zip(self.messages, self.loss_mask, strict=True):
            out = dict(m)
            if m.get("role") == "assistant":
                out["weight"] = w
            messages.append(out)
        meta: dict[str, Any] = {
            "kind": self.kind,
            "instance_id": self.instance_id,
            "attempt": self.attempt,
        }
        if self.segment is not None:
            meta |= {"turns": [self.segment.start, self.segment.stop], "gain": self.segment.gain}
        return {"messages": messages, "tools": [dict(t) for t in self.tools], "metadata": meta}


def whole_sample(traj: Trajectory) -> SftSample:
    """Every message, loss 1 on every assistant message."""
    return SftSample(
        messages=tuple(dict(m) for m in traj.messages),
        loss_mask=tuple(int(m.get("role") == "assistant") for m in traj.messages),
        tools=tuple(dict(t) for t in traj.tools),
        kind="whole",
        instance_id=traj.metadata.task_id,
        attempt=traj.metadata.attempt,
    )


def segment_sample(traj: Trajectory, segment: Segment) -> SftSample:
    """The messages through the segment's last assistant turn; loss 1 on its assistant turns.

    Everything before the segment's first assistant turn is context (loss 0), as are the
    tool/user messages between the segment's assistant turns.
    """
    positions = assistant_positions(traj.messages)
    if not 0 <= segment.start < segment.stop <= len(positions):
        raise ValueError(f"segment {segment} is outside the {len(positions)} assistant turns")
    targets = set(positions[segment.start : segment.stop])
    end = positions[segment.stop - 1] + 1
    return SftSample(
        messages=tuple(dict(m) for m in traj.messages[:end]),
        loss_mask=tuple(int(i in targets) for i in range(end)),
        tools=tuple(dict(t) for t in traj.tools),
        kind="segment",
        instance_id=traj.metadata.task_id,
        attempt=traj.metadata.attempt,
        segment=segment,
    )


def is_resolved(traj: Trajectory) -> bool:
    """The default test: grading said ``resolved``."""
    return traj.metadata.verdict == "resolved"


@attrs.frozen(kw_only=True)
class CreditConfig:
    """Thresholds of :func:`rise_segments`, its smoother, and what counts as resolved."""

    delta: float = 0.2
    epsilon: float = 0.05
    smoother: Smoother | None = None
    resolved: Callable[[Trajectory], bool] = is_resolved

    def __attrs_post_init__(self) -> None:
        _check(self.delta, self.epsilon)


def samples_for(
    traj: Trajectory, values: Sequence[float] | None, cfg: CreditConfig
) -> list[SftSample]:
    """The SFT samples of one trajectory.

    Resolved: one whole sample (``values`` unused). Otherwise one sample per rise segment
    of ``values``, which must hold ``T + 1`` entries for ``T`` assistant turns. A sample with
    no assistant message to train on is not emitted.
    """
    turns = len(assistant_positions(traj.messages))
    if cfg.resolved(traj):
        return [whole_sample(traj)] if turns else []
    if values is None:
        raise ValueError("an unresolved trajectory needs a value curve")
    if len(values) != turns + 1:
        raise ValueError(
            f"expected {turns + 1} values for {turns} assistant turns, got {len(values)}"
        )
    segments = rise_segments(values, delta=cfg.delta, epsilon=cfg.epsilon, smoother=cfg.smoother)
    return [segment_sample(traj, s) for s in segments]


class Estimator(Protocol):
    """Estimates ``V(prefix) = P(resolved | prefix)`` for each prefix of a trajectory.

    ``values`` returns ``T + 1`` floats for ``T`` assistant turns (see the module docstring).
    Monte-Carlo, value-model and judge estimators implement this.
    """

    async def values(self, trajectory: Trajectory) -> list[float]: ...


@attrs.frozen
class FixedValues:
    """A given curve: one for every trajectory, or one per ``(instance_id, attempt)``."""

    curves: Sequence[float] | Mapping[tuple[str, int], Sequence[float]]

    async def values(self, trajectory: Trajectory) -> list[float]:
        """The stored curve (``KeyError`` if a per-trajectory mapping lacks this one)."""
        if isinstance(self.curves, Mapping):
            key = (trajectory.metadata.task_id, trajectory.metadata.attempt)
            return [float(v) for v in self.curves[key]]
        return [float(v) for v in self.curves]


async def credit_samples(
    trajectories: Iterable[Trajectory], estimator: Estimator, cfg: CreditConfig
) -> list[SftSample]:
    """:func:`samples_for` over ``trajectories``; the estimator runs on unresolved ones only."""
    out: list[SftSample] = []
    for traj in trajectories:
        values = None if cfg.resolved(traj) else await estimator.values(traj)
        out.extend(samples_for(traj, values, cfg))
    return out

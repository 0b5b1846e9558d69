"""BAR as the paper ran it: the public reference's rules, decision for decision.

``../shared/BAR-REFERENCE.md`` (and ``docs/swe-training.md``) state them; in short:

- Strides start from zero: the first decision asks for ``stride`` samples (not ``n``), and
  the selection runs on all samples after every stride, until ``n_max``.
- Backfill (never positive nor negative): reward missing, status aborted, or truncated by
  time (``exit_status == "TimeExceeded"``). Positive: any other sample with reward > 0;
  negative: the rest (truncated samples are eligible).
- Each list is ordered by status rank (completed, truncated, truncated by time,
  aborted/other), then arrival (a stable sort).
- The positive count: ``ideal = round((p_min + p_max) / 2 * n)`` (half to even),
  candidates ``ceil(p_min * n)..floor(p_max * n)`` by distance from ``ideal``, ties to the
  smaller; the first that both lists can fill wins. The group is the first ``k``
  positives, then the first ``n - k`` negatives, in that order.
- Budget spent: one more try with bounds ``[0, 1]`` (``"relaxed"``); else the first ``n``
  of positives, negatives, backfill (``"fallback"``).

The functions are pure; :func:`replay` runs one prompt's samples through them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, Literal

import attrs

__all__ = [
    "RefSample",
    "Replayed",
    "candidates",
    "choose_count",
    "classify",
    "ordered",
    "replay",
    "select_group",
]

TIME_EXCEEDED: Final = "TimeExceeded"
RefStatus = Literal["completed", "truncated", "aborted"]
Kind = Literal["positive", "negative", "backfill"]


@attrs.frozen
class RefSample:
    """A sample as the reference sees it: reward (``None``: missing), status, exit status."""

    reward: float | None
    status: str = "completed"
    exit_status: str | None = None

    @property
    def timed_out(self) -> bool:
        """Truncated because it ran out of time (not eligible)."""
        return self.status == "truncated" and self.exit_status == TIME_EXCEEDED

    @property
    def rank(self) -> int:
        """Status rank: completed 0, truncated 1, truncated by time 2, aborted/other 3."""
        if self.status == "completed":
            return 0
        if self.status == "truncated":
            return 2 if self.timed_out else 1
        return 3


def classify(sample: RefSample) -> Kind:
    """Positive (reward > 0), negative, or backfill (see the module doc)."""
    if sample.reward is None or sample.status == "aborted" or sample.timed_out:
        return "backfill"
    return "positive" if sample.reward > 0 else "negative"


def ordered(samples: Sequence[RefSample], kind: Kind) -> list[int]:
    """Indices of ``kind`` samples by status rank, then arrival."""
    found = [i for i, s in enumerate(samples) if classify(s) == kind]
    return sorted(found, key=lambda i: samples[i].rank)  # stable: arrival within a rank


def candidates(n: int, p_min: float, p_max: float) -> list[int]:
    """The positive counts tried, in order: ``ceil(p_min * n)..floor(p_max * n)`` by
    distance from ``round((p_min + p_max) / 2 * n)`` (half to even), ties to the smaller."""
    ideal = round((p_min + p_max) / 2 * n)
    lo, hi = math.ceil(p_min * n), math.floor(p_max * n)
    return sorted(range(lo, hi + 1), key=lambda k: (abs(k - ideal), k))


def choose_count(n: int, p_min: float, p_max: float, positives: int, negatives: int) -> int | None:
    """The number of positives, or ``None`` (fewer than ``n`` eligible, or no count fits)."""
    if positives + negatives < n:
        return None
    for k in candidates(n, p_min, p_max):
        if k <= positives and n - k <= negatives:
            return k
    return None


def select_group(
    samples: Sequence[RefSample], n: int, p_min: float, p_max: float
) -> list[int] | None:
    """The group (positives first, then negatives) within the bounds, or ``None``."""
    pos, neg = ordered(samples, "positive"), ordered(samples, "negative")
    k = choose_count(n, p_min, p_max, len(pos), len(neg))
    if k is None:
        return None
    return pos[:k] + neg[: n - k]


@attrs.frozen
class Replayed:
    """What the reference did for one prompt: samples generated, the group, how."""

    generated: int
    selected: list[int]
    outcome: Literal["found", "relaxed", "fallback"]


def replay(
    samples: Sequence[RefSample], n: int, n_max: int, stride: int, p_min: float, p_max: float
) -> Replayed:
    """Run the reference on a prompt whose every possible sample is ``samples`` (in
    generation order): strides from zero up to ``n_max`` (or as many as there are)."""
    if n < 1 or stride < 1 or n_max < n:
        raise ValueError(f"need 1 <= n <= n_max and stride >= 1 (n={n}, n_max={n_max})")
    if not 0.0 <= p_min <= p_max <= 1.0:
        raise ValueError(f"need 0 <= p_min <= p_max <= 1 (got {p_min}, {p_max})")
    budget = min(n_max, len(samples))
    generated = 0
    while generated < budget:
        generated = min(generated + stride, budget)
        group = select_group(samples[:generated], n, p_min, p_max)
        if group is not None:
            return Replayed(generated, group, "found")
    so_far = samples[:generated]
    group = select_group(so_far, n, 0.0, 1.0)
    if group is not None:
        return Replayed(generated, group, "relaxed")
    fallback = ordered(so_far, "positive") + ordered(so_far, "negative")
    fallback += ordered(so_far, "backfill")
    return Replayed(generated, fallback[:n], "fallback")

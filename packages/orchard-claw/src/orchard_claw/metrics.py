"""Unbiased pass@k and pass^k from n >= k trials per task, intervals, a harness table.

For a task with ``c`` successes in ``n`` trials:

- pass@k = 1 - C(n-c, k) / C(n, k): the chance that at least one of k trials (drawn without
  replacement from the n) succeeds (Chen et al., 2021);
- pass^k = C(c, k) / C(n, k): the chance that all k succeed (tau-bench's reliability).

Aggregates are means over tasks (each task weighs the same, whatever its n). Intervals are
percentile bootstrap intervals over tasks (tasks resampled with replacement, seeded, so a
table is reproducible); they describe how the mean would move with another draw of tasks
like these, not trial noise inside a task. ``wilson_interval`` is the closed form for a
single proportion (pass@1 of independent trials, e.g. one trial per task). Pure functions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "ComparisonTable",
    "HarnessSummary",
    "Interval",
    "TaskEstimate",
    "Trial",
    "aggregate",
    "bootstrap_ci",
    "compare",
    "pass_at_k",
    "pass_hat_k",
    "per_task",
    "summarize",
    "wilson_interval",
]


def _validate(n: int, c: int, k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    if n < k:
        raise ValueError(f"pass@k / pass^k need n >= k trials; got n={n} for k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"successes c={c} must be within 0..n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k) from ``c`` successes in ``n >= k`` trials."""
    _validate(n, c, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k = C(c, k) / C(n, k): all of k trials succeed (``n >= k``)."""
    _validate(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


@attrs.frozen(kw_only=True)
class Trial:
    """One attempt of a harness at a task (``turns``, ``tokens``, ``wall_time_s`` optional)."""

    task_id: str
    passed: bool
    score: float = 0.0
    turns: int | None = None
    tokens: int | None = None
    wall_time_s: float | None = None


@attrs.frozen(kw_only=True)
class TaskEstimate:
    """The estimates for one task from its ``n`` trials with ``c`` successes."""

    task_id: str
    n: int
    c: int
    k: int
    pass_at_1: float
    pass_at_k: float
    pass_hat_k: float


def _outcomes(trials: Iterable[Trial] | Mapping[str, Sequence[bool]]) -> dict[str, list[bool]]:
    if isinstance(trials, Mapping):
        return {task: [bool(x) for x in results] for task, results in trials.items()}
    grouped: dict[str, list[bool]] = {}
    for trial in trials:
        grouped.setdefault(trial.task_id, []).append(trial.passed)
    return grouped


def per_task(trials: Iterable[Trial] | Mapping[str, Sequence[bool]], k: int) -> list[TaskEstimate]:
    """Per-task estimates (sorted by task id); every task needs at least ``k`` trials."""
    estimates = []
    for task, results in sorted(_outcomes(trials).items()):
        n, c = len(results), sum(results)
        if n < k:
            raise ValueError(f"task {task!r} has {n} trial(s); pass@{k} needs at least {k}")
        estimates.append(
            TaskEstimate(
                task_id=task,
                n=n,
                c=c,
                k=k,
                pass_at_1=pass_at_k(n, c, 1),
                pass_at_k=pass_at_k(n, c, k),
                pass_hat_k=pass_hat_k(n, c, k),
            )
        )
    return estimates


def aggregate(estimates: Sequence[TaskEstimate]) -> dict[str, float]:
    """Means over tasks of ``pass_at_1``, ``pass_at_k`` and ``pass_hat_k``."""
    if not estimates:
        raise ValueError("no task estimates to aggregate")
    return {
        name: sum(getattr(e, name) for e in estimates) / len(estimates)
        for name in ("pass_at_1", "pass_at_k", "pass_hat_k")
    }


def _quantile(ordered: Sequence[float], q: float) -> float:
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def bootstrap_ci(
    values: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (resampled with replacement,
    ``resamples`` times, from a ``random.Random(seed)``: the same inputs give the same
    interval). One value gives a zero-width interval."""
    if not values:
        raise ValueError("bootstrap_ci needs at least one value")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), not {confidence}")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    alpha = 1 - confidence
    low, high = _quantile(means, alpha / 2), _quantile(means, 1 - alpha / 2)
    mean = sum(values) / n
    return min(low, mean), max(high, mean)


def wilson_interval(successes: int, total: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion ``successes / total`` (independent trials)."""
    if total < 1 or not 0 <= successes <= total:
        raise ValueError(f"need 0 <= successes <= total and total >= 1; got {successes}/{total}")
    z = _z(confidence)
    p = successes / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    low = 0.0 if successes == 0 else max(0.0, min(p, centre - half))
    high = 1.0 if successes == total else min(1.0, max(p, centre + half))
    return low, high


def _z(confidence: float) -> float:
    """The standard normal quantile for a two-sided ``confidence`` (bisection on erf)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), not {confidence}")
    target = confidence
    lo, hi = 0.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if math.erf(mid / math.sqrt(2)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@attrs.frozen(kw_only=True)
class Interval:
    """An estimate with its interval (``method``: ``bootstrap`` or ``wilson``)."""

    value: float
    low: float
    high: float
    method: str = "bootstrap"

    def format(self, digits: int = 2) -> str:
        """``0.70 [0.55, 0.85]``."""
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


@attrs.frozen(kw_only=True)
class HarnessSummary:
    """One harness's row: estimates with intervals and its cost (means are per trial)."""

    harness: str
    tasks: int
    trials: int
    k: int
    pass_at_1: Interval
    pass_at_k: Interval
    pass_hat_k: Interval
    mean_turns: float | None
    mean_tokens: float | None
    total_tokens: int | None
    mean_wall_time_s: float | None
    per_task: list[TaskEstimate]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return attrs.asdict(self)


def summarize(
    harness: str,
    trials: Sequence[Trial],
    k: int,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> HarnessSummary:
    """A harness's summary: per-task estimates, their means over tasks with bootstrap
    intervals over tasks (seeded), and mean turns, tokens and wall time per trial."""
    if not trials:
        raise ValueError(f"harness {harness!r} has no trials")
    estimates = per_task(trials, k)

    def interval(name: str) -> Interval:
        values = [float(getattr(e, name)) for e in estimates]
        low, high = bootstrap_ci(values, confidence=confidence, resamples=resamples, seed=seed)
        return Interval(value=sum(values) / len(values), low=low, high=high)

    tokens = [t.tokens for t in trials if t.tokens is not None]
    return HarnessSummary(
        harness=harness,
        tasks=len(estimates),
        trials=len(trials),
        k=k,
        pass_at_1=interval("pass_at_1"),
        pass_at_k=interval("pass_at_k"),
        pass_hat_k=interval("pass_hat_k"),
        mean_turns=_mean([t.turns for t in trials if t.turns is not None]),
        mean_tokens=_mean([float(x) for x in tokens]),
        total_tokens=sum(tokens) if tokens else None,
        mean_wall_time_s=_mean([t.wall_time_s for t in trials if t.wall_time_s is not None]),
        per_task=estimates,
    )


@attrs.frozen(kw_only=True)
class ComparisonTable:
    """Harnesses side by side on the same tasks (``rows`` in the order given)."""

    k: int
    confidence: float
    rows: list[HarnessSummary]

    def columns(self) -> list[str]:
        """Column headers for ``cells``."""
        k = self.k
        return [
            "harness",
            "tasks",
            "trials",
            "pass@1",
            f"pass@{k}",
            f"pass^{k}",
            "mean turns",
            "tokens/trial",
            "wall s/trial",
        ]

    def cells(self) -> list[list[str]]:
        """One formatted row of strings per harness (intervals in brackets; ``-`` unknown)."""

        def num(value: float | None, fmt: str) -> str:
            return "-" if value is None else format(value, fmt)

        return [
            [
                r.harness,
                str(r.tasks),
                str(r.trials),
                r.pass_at_1.format(),
                r.pass_at_k.format(),
                r.pass_hat_k.format(),
                num(r.mean_turns, ".1f"),
                num(r.mean_tokens, ",.0f"),
                num(r.mean_wall_time_s, ".1f"),
            ]
            for r in self.rows
        ]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``rows`` with their per-task estimates)."""
        return attrs.asdict(self)


def compare(
    trials_by_harness: Mapping[str, Sequence[Trial]],
    k: int,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> ComparisonTable:
    """A ``ComparisonTable`` of harnesses; all must have been run on the same task ids."""
    if not trials_by_harness:
        raise ValueError("no harnesses to compare")
    task_sets = {h: {t.task_id for t in ts} for h, ts in trials_by_harness.items()}
    first = next(iter(task_sets.values()))
    for harness, tasks in task_sets.items():
        if tasks != first:
            raise ValueError(
                f"harness {harness!r} ran other tasks than the first "
                f"(missing {sorted(first - tasks)[:5]}, extra {sorted(tasks - first)[:5]})"
            )
    rows = [
        summarize(h, ts, k, confidence=confidence, resamples=resamples, seed=seed)
        for h, ts in trials_by_harness.items()
    ]
    return ComparisonTable(k=k, confidence=confidence, rows=rows)

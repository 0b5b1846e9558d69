"""Balanced Adaptive Rollout (BAR): a rollout allocator for sparse-reward group RL.

Per prompt, samples are generated in strides up to ``n_max``. After each stride the
allocator looks for a group of ``n`` finished samples whose positive ratio lies in
``[p_min, p_max]`` and stops as soon as one exists. When the budget is spent it tries the
relaxed bounds of :attr:`BarConfig.relax` in order, and finally falls back to the
best-ranked samples (completed > truncated > time_exceeded > aborted, then arrival order).

The core, :func:`decide`, is a pure function of the samples so far and the config; it
returns :class:`GenerateMore` or a :class:`Selection`. :func:`bar_rollout` drives any async
``generate(k)`` with it, and :func:`select` turns a selection into a :class:`Group` and runs
the group filters (:class:`DropUniform`, :class:`ZeroLoss`). See ``docs/swe-training.md``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from enum import StrEnum
from typing import Any, Final, Literal, Protocol

import attrs

from . import bar_reference

__all__ = [
    "STATUS_RANK",
    "BarConfig",
    "Bounds",
    "Decision",
    "DropUniform",
    "GenerateMore",
    "Group",
    "GroupFilter",
    "GroupResult",
    "Outcome",
    "Profile",
    "Sample",
    "Selection",
    "Status",
    "ZeroLoss",
    "apply_filters",
    "bar_rollout",
    "choose_positive_count",
    "decide",
    "decide_orchard",
    "decide_reference",
    "default_relax",
    "select",
]

_TOL: Final = 1e-9

Bounds = tuple[float, float]
"""``(p_min, p_max)``: the allowed share of positives in a group."""

Profile = Literal["reference", "orchard"]
"""Whose rules: the public reference's (the paper's numbers) or our own allocator's."""

Outcome = Literal["found", "relaxed", "fallback"]
"""How a group was chosen: within the bounds, within relaxed bounds, or by ranking."""


class Status(StrEnum):
    """How a rollout ended."""

    COMPLETED = "completed"
    TRUNCATED = "truncated"
    TIME_EXCEEDED = "time_exceeded"
    ABORTED = "aborted"


STATUS_RANK: Final[dict[Status, int]] = {
    Status.COMPLETED: 0,
    Status.TRUNCATED: 1,
    Status.TIME_EXCEEDED: 2,
    Status.ABORTED: 3,
}
"""Fallback ranking: lower is better."""


@attrs.frozen
class Sample:
    """One finished rollout: its reward, how it ended, and an opaque payload."""

    reward: float
    status: Status = attrs.field(default=Status.COMPLETED, converter=Status)
    payload: Any = attrs.field(default=None, eq=False)


def default_relax(n: int, p_min: float, p_max: float, steps: int = 2) -> tuple[Bounds, ...]:
    """Bounds widened linearly in ``steps`` from ``(p_min, p_max)`` to ``(1/n, 1 - 1/n)``.

    The last step asks only for at least one positive and one negative. Bounds that are not
    wider than the original are left out (so ``n == 1`` or already-wide bounds give ``()``).
    """
    lo_end = min(p_min, 1.0 / n)
    hi_end = max(p_max, 1.0 - 1.0 / n)
    out: list[Bounds] = []
    for j in range(1, steps + 1):
        bounds = (p_min + (lo_end - p_min) * j / steps, p_max + (hi_end - p_max) * j / steps)
        if bounds != (p_min, p_max) and bounds not in out:
            out.append(bounds)
    return tuple(out)


def _check_bounds(bounds: Bounds) -> None:
    lo, hi = bounds
    if not (0.0 <= lo <= hi <= 1.0):
        raise ValueError(f"bounds must satisfy 0 <= p_min <= p_max <= 1, got {bounds}")


def _valid_counts(n: int, bounds: Bounds) -> list[int]:
    lo, hi = bounds
    return [k for k in range(n + 1) if lo * n - _TOL <= k <= hi * n + _TOL]


@attrs.frozen(kw_only=True)
class BarConfig:
    """BAR's parameters.

    ``profile`` picks the rules: ``"reference"`` (the default) is the public reference's,
    decision for decision (``bar_reference``); ``"orchard"`` is our own allocator, for
    which the rest applies: ``relax=None`` means :func:`default_relax`; ``()`` disables
    relaxing. A sample is positive when ``reward >= positive_threshold``; only samples
    whose status is in ``eligible`` take part in the bounded search (all take part in the
    fallback). See ``docs/swe-training.md`` for the two side by side.
    """

    n: int = 8
    n_max: int = 32
    stride: int = 8
    p_min: float = 0.25
    p_max: float = 0.75
    profile: Profile = "reference"
    relax: tuple[Bounds, ...] | None = None
    positive_threshold: float = 0.5
    eligible: frozenset[Status] = frozenset({Status.COMPLETED})

    def __attrs_post_init__(self) -> None:
        if self.n < 1 or self.n_max < self.n or self.stride < 1:
            raise ValueError(
                "need 1 <= n <= n_max and stride >= 1 "
                f"(n={self.n}, n_max={self.n_max}, stride={self.stride})"
            )
        _check_bounds((self.p_min, self.p_max))
        if self.profile not in ("reference", "orchard"):
            raise ValueError(f"profile must be 'reference' or 'orchard', got {self.profile!r}")
        # The reference has no such check: with no count in its bounds it just relaxes.
        if self.profile == "orchard" and not _valid_counts(self.n, (self.p_min, self.p_max)):
            raise ValueError(f"no count k in 0..{self.n} has k/n in [{self.p_min}, {self.p_max}]")
        for bounds in self.relax or ():
            _check_bounds(bounds)

    @property
    def relax_schedule(self) -> tuple[Bounds, ...]:
        """The relaxed bounds tried, in order, once the budget is spent."""
        if self.relax is None:
            return default_relax(self.n, self.p_min, self.p_max)
        return self.relax

    def is_positive(self, sample: Sample) -> bool:
        """Whether ``sample`` counts as a positive."""
        if self.profile == "reference":
            return bar_reference.classify(_as_reference(sample)) == "positive"
        return sample.reward >= self.positive_threshold


@attrs.frozen
class GenerateMore:
    """Decision: generate ``count`` more samples, then call :func:`decide` again."""

    count: int


@attrs.frozen
class Selection:
    """Decision: the group is the samples at ``indices``."""

    indices: tuple[int, ...]
    """Ascending for the ``orchard`` profile; the ``reference`` one's own order
    (positives, then negatives, then backfill)."""
    outcome: Outcome
    bounds: Bounds | None
    """The bounds satisfied; ``None`` for the fallback."""


Decision = GenerateMore | Selection


def choose_positive_count(n: int, bounds: Bounds, positives: int, negatives: int) -> int | None:
    """The number of positives for a group of ``n``, or ``None`` if no count fits.

    Valid counts are the ``k`` with ``k/n`` in ``bounds`` (within 1e-9), ``k <= positives``
    and ``n - k <= negatives``. The chosen one is nearest ``n * (p_min + p_max) / 2``; ties
    go to the ``k`` nearest ``n / 2`` (largest reward variance), then to the larger ``k``
    (positives are the scarce signal under sparse rewards).
    """
    target = n * (bounds[0] + bounds[1]) / 2
    valid = [k for k in _valid_counts(n, bounds) if k <= positives and n - k <= negatives]
    if not valid:
        return None
    return min(valid, key=lambda k: (abs(k - target), abs(k - n / 2), -k))


def _search(samples: Sequence[Sample], cfg: BarConfig, bounds: Bounds) -> tuple[int, ...] | None:
    pos: list[int] = []
    neg: list[int] = []
    for i, s in enumerate(samples):
        if s.status in cfg.eligible:
            (pos if cfg.is_positive(s) else neg).append(i)
    k = choose_positive_count(cfg.n, bounds, len(pos), len(neg))
    if k is None:
        return None
    return tuple(sorted(pos[:k] + neg[: cfg.n - k]))


def _fallback(samples: Sequence[Sample], n: int) -> tuple[int, ...]:
    ranked = sorted(range(len(samples)), key=lambda i: (STATUS_RANK[samples[i].status], i))
    return tuple(sorted(ranked[:n]))


def decide(samples: Sequence[Sample], cfg: BarConfig, *, requested: int | None = None) -> Decision:
    """BAR's next step given the samples so far (pure and deterministic), by the rules of
    ``cfg.profile``: :func:`decide_reference`, or :func:`decide_orchard`."""
    if cfg.profile == "reference":
        return decide_reference(samples, cfg, requested=requested)
    return decide_orchard(samples, cfg, requested=requested)


def decide_reference(
    samples: Sequence[Sample], cfg: BarConfig, *, requested: int | None = None
) -> Decision:
    """The public reference's next step (``bar_reference``): the group within the bounds
    if there is one; else ``stride`` more (the first stride too), up to ``n_max``; then
    bounds ``[0, 1]``; then positives, negatives and backfill in rank order."""
    ref = [_as_reference(s) for s in samples]
    group = bar_reference.select_group(ref, cfg.n, cfg.p_min, cfg.p_max)
    if group is not None:
        return Selection(tuple(group), "found", (cfg.p_min, cfg.p_max))
    budget = cfg.n_max - max(len(samples), requested or 0)
    if budget > 0:
        return GenerateMore(min(budget, cfg.stride))
    group = bar_reference.select_group(ref, cfg.n, 0.0, 1.0)
    if group is not None:
        return Selection(tuple(group), "relaxed", (0.0, 1.0))
    ranked = [i for kind in _KINDS for i in bar_reference.ordered(ref, kind)]
    return Selection(tuple(ranked[: cfg.n]), "fallback", None)


_KINDS: Final[tuple[bar_reference.Kind, ...]] = ("positive", "negative", "backfill")


def _as_reference(sample: Sample) -> bar_reference.RefSample:
    if sample.status is Status.TIME_EXCEEDED:
        return bar_reference.RefSample(sample.reward, "truncated", bar_reference.TIME_EXCEEDED)
    return bar_reference.RefSample(sample.reward, sample.status.value)


def decide_orchard(
    samples: Sequence[Sample], cfg: BarConfig, *, requested: int | None = None
) -> Decision:
    """Our own allocator's next step (pure and deterministic).

    1. If ``n`` eligible samples (earliest first) fit ``[p_min, p_max]``: select them
       (``"found"``; :func:`choose_positive_count` picks the positive count).
    2. Else, while the budget ``n_max - max(len(samples), requested)`` is positive: generate
       ``min(budget, max(stride, n - eligible))`` more (the first request is at least ``n``).
    3. Else, the first relaxed bounds that fit (``"relaxed"``).
    4. Else, the ``n`` best-ranked samples of any status (``"fallback"``; fewer if fewer
       exist): by :data:`STATUS_RANK`, then arrival.
    """
    found = _search(samples, cfg, (cfg.p_min, cfg.p_max))
    if found is not None:
        return Selection(found, "found", (cfg.p_min, cfg.p_max))
    used = max(len(samples), requested or 0)
    budget = cfg.n_max - used
    if budget > 0:
        eligible = sum(1 for s in samples if s.status in cfg.eligible)
        return GenerateMore(min(budget, max(cfg.stride, cfg.n - eligible)))
    for bounds in cfg.relax_schedule:
        relaxed = _search(samples, cfg, bounds)
        if relaxed is not None:
            return Selection(relaxed, "relaxed", bounds)
    return Selection(_fallback(samples, cfg.n), "fallback", None)


@attrs.frozen
class Group:
    """A selected group with one loss weight per sample (1.0 unless a filter changed it)."""

    samples: tuple[Sample, ...]
    indices: tuple[int, ...]
    weights: tuple[float, ...]
    outcome: Outcome
    bounds: Bounds | None
    positives: int

    @property
    def rewards(self) -> tuple[float, ...]:
        """The samples' rewards."""
        return tuple(s.reward for s in self.samples)

    @property
    def is_uniform(self) -> bool:
        """All rewards equal: every group-relative advantage is zero."""
        return len(set(self.rewards)) <= 1

    def advantages(self, eps: float = 1e-6) -> list[float]:
        """GRPO advantages ``(r - mean) / (std + eps)`` over the whole group (0 if uniform)."""
        rewards = self.rewards
        if self.is_uniform:
            return [0.0] * len(rewards)
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        return [(r - mean) / (std + eps) for r in rewards]


class GroupFilter(Protocol):
    """A hook run on a selected group: the group (maybe re-weighted), or ``None`` to drop it."""

    def __call__(self, group: Group) -> Group | None: ...


@attrs.frozen
class DropUniform:
    """Drop groups with no positive (``all_negative``) or no negative (``all_positive``)."""

    all_negative: bool = True
    all_positive: bool = True
    threshold: float = 0.5

    def __call__(self, group: Group) -> Group | None:
        """``None`` for a dropped group, else the group unchanged."""
        positives = sum(1 for s in group.samples if s.reward >= self.threshold)
        if self.all_negative and positives == 0:
            return None
        if self.all_positive and positives == len(group.samples):
            return None
        return group


@attrs.frozen
class ZeroLoss:
    """Keep every sample for the baseline but set the loss weight of the matching ones to 0.

    ``ZeroLoss.negatives()`` zeroes negatives; ``ZeroLoss.statuses(...)`` zeroes samples that
    ended with those statuses (e.g. truncated ones, DAPO's overlong filtering).
    """

    predicate: Callable[[Sample], bool]
    name: str = "zero_loss"

    @classmethod
    def negatives(cls, threshold: float = 0.5) -> ZeroLoss:
        """Zero the loss of samples with ``reward < threshold``."""
        return cls(lambda s: s.reward < threshold, "zero_loss_negatives")

    @classmethod
    def statuses(cls, *statuses: Status | str) -> ZeroLoss:
        """Zero the loss of samples whose status is one of ``statuses``."""
        wanted = frozenset(Status(s) for s in statuses)
        return cls(lambda s: s.status in wanted, "zero_loss_statuses")

    def __call__(self, group: Group) -> Group | None:
        """The group with the matching samples' weights set to 0."""
        weights = tuple(
            0.0 if self.predicate(s) else w
            for s, w in zip(group.samples, group.weights, strict=True)
        )
        return attrs.evolve(group, weights=weights)


def _filter_name(f: GroupFilter) -> str:
    name = getattr(f, "name", None) or getattr(f, "__name__", None)
    return str(name) if name else type(f).__name__


def apply_filters(group: Group, filters: Sequence[GroupFilter]) -> tuple[Group | None, str | None]:
    """Run ``filters`` in order: ``(group, None)``, or ``(None, name)`` of the dropping one."""
    current: Group | None = group
    for f in filters:
        assert current is not None
        current = f(current)
        if current is None:
            return None, _filter_name(f)
    return current, None


@attrs.frozen
class GroupResult:
    """What BAR produced for one prompt."""

    selected: Group
    """The group before filters."""
    group: Group | None
    """The group after filters; ``None`` if one dropped it."""
    dropped_by: str | None
    samples: tuple[Sample, ...]
    """Every sample generated, in arrival order (``selected.indices`` index into it)."""
    requested: int
    strides: int

    @property
    def outcome(self) -> Outcome:
        """How the group was chosen."""
        return self.selected.outcome


def select(
    samples: Sequence[Sample],
    selection: Selection,
    cfg: BarConfig,
    filters: Sequence[GroupFilter] = (),
    *,
    requested: int | None = None,
    strides: int = 0,
) -> GroupResult:
    """Build the :class:`Group` of ``selection`` (weights 1.0) and run ``filters`` on it."""
    chosen = tuple(samples[i] for i in selection.indices)
    group = Group(
        samples=chosen,
        indices=selection.indices,
        weights=tuple(1.0 for _ in chosen),
        outcome=selection.outcome,
        bounds=selection.bounds,
        positives=sum(1 for s in chosen if cfg.is_positive(s)),
    )
    kept, dropped_by = apply_filters(group, filters)
    return GroupResult(
        selected=group,
        group=kept,
        dropped_by=dropped_by,
        samples=tuple(samples),
        requested=max(len(samples), requested or 0),
        strides=strides,
    )


async def bar_rollout(
    generate: Callable[[int], Awaitable[Sequence[Sample]]],
    cfg: BarConfig,
    filters: Sequence[GroupFilter] = (),
) -> GroupResult:
    """Run BAR for one prompt: call ``generate(k)`` stride by stride until a group is chosen.

    ``generate`` may return fewer samples than asked (failed rollouts); the budget counts
    what was requested, so the loop always ends after at most ``n_max`` requested samples.
    """
    samples: list[Sample] = []
    requested = 0
    strides = 0
    while True:
        decision = decide(samples, cfg, requested=requested)
        if isinstance(decision, Selection):
            return select(samples, decision, cfg, filters, requested=requested, strides=strides)
        requested += decision.count
        strides += 1
        samples.extend(await generate(decision.count))

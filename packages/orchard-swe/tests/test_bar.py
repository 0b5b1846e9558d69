"""BAR, our own allocator (profile "orchard"): the pure decision core, every branch, the async
driver and the group filters (the reference profile: test_bar_reference.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from orchard_swe.algorithms.bar import (
    STATUS_RANK,
    BarConfig,
    DropUniform,
    GenerateMore,
    Group,
    Sample,
    Selection,
    Status,
    ZeroLoss,
    apply_filters,
    bar_rollout,
    choose_positive_count,
    decide,
    default_relax,
    select,
)

pytestmark = pytest.mark.fast

TOL = 1e-9


# ---------------------------------------------------------------- strategies


@st.composite
def configs(draw: st.DrawFn) -> BarConfig:
    n = draw(st.integers(1, 10))
    n_max = draw(st.integers(n, 40))
    stride = draw(st.integers(1, 12))
    pairs = [
        (lo, hi)
        for lo in (0.0, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5)
        for hi in (0.5, 0.6, 0.7, 0.75, 0.8, 1.0)
        if any(lo * n - TOL <= k <= hi * n + TOL for k in range(n + 1))
    ]
    lo, hi = draw(st.sampled_from(pairs))
    relax = draw(
        st.one_of(
            st.none(),
            st.lists(
                st.tuples(st.floats(0, 0.5), st.floats(0.5, 1)).map(lambda b: (b[0], b[1])),
                max_size=3,
            ).map(tuple),
        )
    )
    return BarConfig(
        profile="orchard", n=n, n_max=n_max, stride=stride, p_min=lo, p_max=hi, relax=relax
    )


samples_st = st.builds(
    Sample,
    reward=st.sampled_from([0.0, 1.0, 0.2, 0.7]),
    status=st.sampled_from(list(Status)),
)


@st.composite
def sample_lists(draw: st.DrawFn) -> list[Sample]:
    """Samples with a per-list positive rate, mostly completed (so every branch is reached)."""
    rate = draw(st.sampled_from([0, 1, 3, 5, 9, 10]))
    size = draw(st.integers(0, 45))
    statuses = [Status.COMPLETED] * 6 + [s for s in Status if s is not Status.COMPLETED]
    out = []
    for _ in range(size):
        reward = 1.0 if draw(st.integers(0, 9)) < rate else draw(st.sampled_from([0.0, 0.2]))
        out.append(Sample(reward, draw(st.sampled_from(statuses))))
    return out


def _split(samples: Sequence[Sample], cfg: BarConfig) -> tuple[list[int], list[int]]:
    pos = [i for i, s in enumerate(samples) if s.status in cfg.eligible and cfg.is_positive(s)]
    neg = [i for i, s in enumerate(samples) if s.status in cfg.eligible and not cfg.is_positive(s)]
    return pos, neg


def _fits(n: int, bounds: tuple[float, float], p: int, q: int) -> list[int]:
    lo, hi = bounds
    return [k for k in range(n + 1) if lo * n - TOL <= k <= hi * n + TOL and k <= p and n - k <= q]


# ---------------------------------------------------------------- config and count choice


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        BarConfig(profile="orchard", n=8, n_max=4)
    with pytest.raises(ValueError):
        BarConfig(profile="orchard", stride=0)
    with pytest.raises(ValueError):
        BarConfig(profile="orchard", p_min=0.8, p_max=0.2)
    with pytest.raises(ValueError, match="no count"):
        BarConfig(profile="orchard", n=4, p_min=0.3, p_max=0.45)
    with pytest.raises(ValueError):
        BarConfig(profile="orchard", relax=((0.5, 1.2),))


def test_default_relax_widens_to_one_positive_one_negative() -> None:
    schedule = default_relax(8, 0.25, 0.75)
    assert schedule == ((0.1875, 0.8125), (0.125, 0.875))
    assert BarConfig(profile="orchard").relax_schedule == schedule
    assert default_relax(1, 0.0, 1.0) == ()
    assert BarConfig(profile="orchard", relax=()).relax_schedule == ()


def test_choose_positive_count_examples() -> None:
    assert choose_positive_count(8, (0.25, 0.75), 10, 10) == 4
    assert choose_positive_count(8, (0.25, 0.75), 3, 10) == 3  # nearest 4 with 3 positives
    assert choose_positive_count(8, (0.25, 0.75), 10, 3) == 5  # needs 8-k <= 3
    assert choose_positive_count(8, (0.25, 0.75), 1, 10) is None
    # target 1.5 ties 1 and 2: 2 is nearer n/2
    assert choose_positive_count(4, (0.25, 0.5), 4, 4) == 2
    # target 2.5 ties 2 and 3, both 0.5 from n/2 = 2.5: the larger wins
    assert choose_positive_count(5, (0.2, 0.8), 5, 5) == 3


@given(
    n=st.integers(1, 12),
    lo=st.floats(0, 1),
    width=st.floats(0, 1),
    p=st.integers(0, 15),
    q=st.integers(0, 15),
)
def test_choose_positive_count_is_the_documented_optimum(
    n: int, lo: float, width: float, p: int, q: int
) -> None:
    bounds = (lo, min(1.0, lo + width))
    valid = _fits(n, bounds, p, q)
    k = choose_positive_count(n, bounds, p, q)
    if not valid:
        assert k is None
        return
    assert k in valid
    target = n * (bounds[0] + bounds[1]) / 2
    best = min(valid, key=lambda j: (abs(j - target), abs(j - n / 2), -j))
    assert k == best
    assert all(abs(k - target) <= abs(j - target) for j in valid)


# ---------------------------------------------------------------- decide: every branch


@settings(max_examples=300)
@given(cfg=configs(), samples=sample_lists(), extra=st.integers(0, 10), spent=st.booleans())
def test_decide_follows_the_branches_in_order(
    cfg: BarConfig, samples: list[Sample], extra: int, spent: bool
) -> None:
    requested = len(samples) + extra
    if spent:
        requested = max(requested, cfg.n_max)
    decision = decide(samples, cfg, requested=requested)
    assert decision == decide(samples, cfg, requested=requested)  # deterministic
    pos, neg = _split(samples, cfg)
    main = _fits(cfg.n, (cfg.p_min, cfg.p_max), len(pos), len(neg))
    budget = cfg.n_max - requested
    event(
        type(decision).__name__
        + ("/" + decision.outcome if isinstance(decision, Selection) else "")
    )
    if main:
        # early stop: found within the bounds
        assert isinstance(decision, Selection) and decision.outcome == "found"
        assert decision.bounds == (cfg.p_min, cfg.p_max)
        k = choose_positive_count(cfg.n, (cfg.p_min, cfg.p_max), len(pos), len(neg))
        assert k is not None
        assert decision.indices == tuple(sorted(pos[:k] + neg[: cfg.n - k]))
        return
    if budget > 0:
        # another stride, never past n_max, at least enough to reach n eligible
        assert isinstance(decision, GenerateMore)
        eligible = len(pos) + len(neg)
        assert decision.count == min(budget, max(cfg.stride, cfg.n - eligible))
        assert 1 <= decision.count <= budget
        return
    assert isinstance(decision, Selection)
    fitting = [b for b in cfg.relax_schedule if _fits(cfg.n, b, len(pos), len(neg))]
    if fitting:
        # strides exhausted: the first relaxed bounds that fit
        assert decision.outcome == "relaxed"
        assert decision.bounds == fitting[0]
        chosen = [samples[i] for i in decision.indices]
        assert len(chosen) == cfg.n
        assert all(s.status in cfg.eligible for s in chosen)
        share = sum(cfg.is_positive(s) for s in chosen) / cfg.n
        assert fitting[0][0] - TOL <= share <= fitting[0][1] + TOL
        return
    # fallback: the n best-ranked samples, status first, then arrival
    assert decision.outcome == "fallback" and decision.bounds is None
    assert len(decision.indices) == min(cfg.n, len(samples))
    assert list(decision.indices) == sorted(decision.indices)
    chosen = set(decision.indices)
    for i in chosen:
        for j in set(range(len(samples))) - chosen:
            assert (STATUS_RANK[samples[i].status], i) < (STATUS_RANK[samples[j].status], j)


def test_first_request_is_at_least_n() -> None:
    assert decide([], BarConfig(profile="orchard", n=8, stride=4)) == GenerateMore(8)
    assert decide([], BarConfig(profile="orchard", n=8, n_max=8, stride=16)) == GenerateMore(8)
    assert decide([], BarConfig(profile="orchard", n=4, stride=6)) == GenerateMore(6)


def test_early_stop_picks_earliest_samples() -> None:
    cfg = BarConfig(profile="orchard", n=4, n_max=16, stride=4, p_min=0.25, p_max=0.75)
    samples = [
        Sample(0.0),
        Sample(1.0),
        Sample(0.0),
        Sample(0.0, "truncated"),
        Sample(1.0),
        Sample(0.0),
        Sample(1.0),
    ]
    decision = decide(samples, cfg)
    assert decision == Selection((0, 1, 2, 4), "found", (0.25, 0.75))


def test_fallback_prefers_completed_then_truncated_then_time_exceeded_then_aborted() -> None:
    cfg = BarConfig(profile="orchard", n=3, n_max=5, stride=5, p_min=0.3, p_max=0.7, relax=())
    samples = [
        Sample(0.0, "aborted"),
        Sample(0.0, "time_exceeded"),
        Sample(0.0, "truncated"),
        Sample(0.0),
        Sample(0.0, "truncated"),
    ]
    decision = decide(samples, cfg)
    assert decision == Selection((2, 3, 4), "fallback", None)


# ---------------------------------------------------------------- the async driver


def _fake_generate(
    stream: list[Sample], calls: list[int], short: int = 0
) -> Callable[[int], Awaitable[list[Sample]]]:
    pos = 0

    async def generate(k: int) -> list[Sample]:
        nonlocal pos
        calls.append(k)
        take = max(0, k - short)
        out = stream[pos : pos + take]
        pos += take
        await asyncio.sleep(0)
        return out

    return generate


@settings(max_examples=200)
@given(
    cfg=configs(), stream=st.lists(samples_st, min_size=60, max_size=60), short=st.integers(0, 3)
)
async def test_bar_rollout_matches_decide(cfg: BarConfig, stream: list[Sample], short: int) -> None:
    calls: list[int] = []
    result = await bar_rollout(_fake_generate(stream, calls, short), cfg)
    assert sum(calls) == result.requested <= cfg.n_max
    assert result.strides == len(calls)
    generated = list(result.samples)
    assert generated == stream[: len(generated)]
    final = decide(generated, cfg, requested=result.requested)
    assert isinstance(final, Selection)
    assert final.indices == result.selected.indices
    assert final.outcome == result.outcome
    # early stop: no earlier stride already had a group within the bounds
    seen = 0
    for k in calls[:-1]:
        seen += max(0, k - short)
        before = decide(generated[:seen], cfg, requested=cfg.n_max)
        assert not (isinstance(before, Selection) and before.outcome == "found")
    if result.outcome != "found":
        assert result.requested == cfg.n_max
    # deterministic
    again = await bar_rollout(_fake_generate(stream, [], short), cfg)
    assert again == result


async def test_bar_rollout_stops_at_the_first_good_stride() -> None:
    cfg = BarConfig(profile="orchard", n=4, n_max=16, stride=4, p_min=0.25, p_max=0.75)
    stream = [Sample(0.0)] * 4 + [Sample(1.0), Sample(0.0)] * 4
    calls: list[int] = []
    result = await bar_rollout(_fake_generate(stream, calls), cfg, [DropUniform()])
    assert calls == [4, 4]
    assert result.outcome == "found"
    assert result.group is not None and result.group.positives == 2


async def test_bar_rollout_relaxes_then_falls_back() -> None:
    cfg = BarConfig(profile="orchard", n=4, n_max=8, stride=4, p_min=0.5, p_max=0.5)
    one_positive = [Sample(1.0)] + [Sample(0.0)] * 7
    result = await bar_rollout(_fake_generate(one_positive, []), cfg)
    assert result.outcome == "relaxed" and result.selected.positives == 1
    assert result.selected.bounds == (0.25, 0.75)
    none_positive = [Sample(0.0, "truncated")] * 2 + [Sample(0.0)] * 6
    result = await bar_rollout(_fake_generate(none_positive, []), cfg, [DropUniform()])
    assert result.outcome == "fallback"
    assert result.selected.indices == (2, 3, 4, 5)
    assert result.group is None and result.dropped_by == "DropUniform"


async def test_bar_rollout_ends_when_generate_returns_nothing() -> None:
    calls: list[int] = []
    result = await bar_rollout(
        _fake_generate([], calls), BarConfig(profile="orchard", n=2, n_max=5, stride=2)
    )
    assert sum(calls) == 5
    assert result.samples == () and result.selected.samples == ()


# ---------------------------------------------------------------- filters


def _group(rewards: Sequence[float], statuses: Sequence[str] | None = None) -> Group:
    statuses = statuses or ["completed"] * len(rewards)
    samples = [Sample(r, s) for r, s in zip(rewards, statuses, strict=True)]
    sel = Selection(tuple(range(len(samples))), "found", (0.0, 1.0))
    return select(
        samples,
        sel,
        BarConfig(
            profile="orchard",
            n=max(1, len(samples)),
            n_max=max(1, len(samples)),
            p_min=0.0,
            p_max=1.0,
        ),
    ).selected


def test_drop_uniform() -> None:
    drop = DropUniform()
    assert drop(_group([0, 0, 0])) is None
    assert drop(_group([1, 1])) is None
    mixed = _group([0, 1, 0])
    assert drop(mixed) is mixed
    assert DropUniform(all_negative=False)(_group([0, 0])) is not None
    assert DropUniform(all_positive=False)(_group([1, 1])) is not None


def test_zero_loss_keeps_samples_for_the_baseline() -> None:
    group = _group([1, 0, 1, 0], ["completed", "completed", "truncated", "aborted"])
    neg = ZeroLoss.negatives()(group)
    assert neg is not None
    assert neg.samples == group.samples and neg.indices == group.indices
    assert neg.weights == (1.0, 0.0, 1.0, 0.0)
    assert neg.advantages() == group.advantages()  # the baseline is unchanged
    st_ = ZeroLoss.statuses("truncated", Status.ABORTED)(group)
    assert st_ is not None and st_.weights == (1.0, 1.0, 0.0, 0.0)


@given(
    rewards=st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=12),
    order=st.permutations(["drop", "neg"]),
)
def test_filter_chain_properties(rewards: list[float], order: list[str]) -> None:
    group = _group(rewards)
    hooks = {"drop": DropUniform(), "neg": ZeroLoss.negatives()}
    kept, dropped_by = apply_filters(group, [hooks[k] for k in order])
    uniform = len(set(rewards)) == 1
    assert (kept is None) == uniform
    if kept is None:
        assert dropped_by == "DropUniform"
        return
    assert dropped_by is None
    assert kept.samples == group.samples
    assert kept.weights == tuple(float(r >= 0.5) for r in rewards)


@given(rewards=st.lists(st.floats(0, 1), min_size=1, max_size=10))
def test_advantages(rewards: list[float]) -> None:
    adv = _group(rewards).advantages()
    assert len(adv) == len(rewards)
    assert abs(sum(adv)) < 1e-6 * len(adv) + 1e-9 or max(rewards) - min(rewards) < 1e-3
    if len(set(rewards)) == 1:
        assert all(a == 0.0 for a in adv)

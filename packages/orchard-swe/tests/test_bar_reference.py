"""BAR's reference profile: each rule of the public reference by a hand-worked case, and
properties over random prompts (``../shared/BAR-REFERENCE.md``)."""

from __future__ import annotations

import asyncio
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_swe.algorithms.bar import BarConfig, Sample, Status, bar_rollout
from orchard_swe.algorithms.bar_reference import (
    RefSample,
    candidates,
    choose_count,
    classify,
    ordered,
    replay,
    select_group,
)

P, N = RefSample(1.0), RefSample(0.0)  # a completed positive and negative


def test_positive_means_reward_above_zero() -> None:
    assert classify(RefSample(0.01)) == "positive"
    assert classify(RefSample(0.0)) == "negative"
    assert classify(RefSample(-1.0)) == "negative"


def test_truncated_samples_are_eligible_but_timed_out_and_aborted_ones_backfill() -> None:
    assert classify(RefSample(1.0, "truncated")) == "positive"
    assert classify(RefSample(1.0, "truncated", "ContextLimit")) == "positive"
    assert classify(RefSample(1.0, "truncated", "TimeExceeded")) == "backfill"
    assert classify(RefSample(1.0, "aborted")) == "backfill"
    assert classify(RefSample(None)) == "backfill"


def test_lists_are_ordered_by_status_rank_then_arrival() -> None:
    samples = [RefSample(1.0, "truncated"), P, RefSample(1.0, "truncated"), P]
    assert ordered(samples, "positive") == [1, 3, 0, 2]
    backfill = [
        RefSample(None, "aborted"),
        RefSample(1, "truncated", "TimeExceeded"),
        RefSample(None),
    ]
    assert ordered(backfill, "backfill") == [2, 1, 0]  # completed 0, timed out 2, aborted 3


def test_strides_start_from_zero_and_may_be_smaller_than_n() -> None:
    # n=4, stride=2: looks at 2 samples (too few), then 4: a group of 2+2 is found there.
    samples = [P, N, P, N, P, P, P, P]
    got = replay(samples, n=4, n_max=8, stride=2, p_min=0.25, p_max=0.75)
    assert (got.generated, got.selected, got.outcome) == (4, [0, 2, 1, 3], "found")
    # The orchard allocator would have asked for n=4 at once; the reference asks for 2.
    cfg = BarConfig(n=4, n_max=8, stride=2, profile="reference")
    assert _driven(samples, cfg)[0] == [2, 2]


def test_the_ideal_count_rounds_half_to_even() -> None:
    # n=5, bounds [0.25, 0.75]: 0.5 * 5 = 2.5 rounds to 2 (half up would give 3).
    assert candidates(5, 0.25, 0.75)[0] == 2
    samples = [P, P, P, N, N, N]
    got = replay(samples, n=5, n_max=6, stride=6, p_min=0.25, p_max=0.75)
    assert got.selected == [0, 1, 3, 4, 5]  # 2 positives, 3 negatives


def test_equal_distances_go_to_the_smaller_count() -> None:
    assert candidates(4, 0.25, 0.75) == [2, 1, 3]
    assert candidates(8, 0.0, 1.0) == [4, 3, 5, 2, 6, 1, 7, 0, 8]
    assert choose_count(4, 0.25, 0.75, positives=1, negatives=5) == 1


def test_the_group_is_positives_first_then_negatives_in_rank_order() -> None:
    samples = [N, RefSample(1.0, "truncated"), N, P, N]
    got = replay(samples, n=4, n_max=5, stride=5, p_min=0.5, p_max=0.5)
    assert got.selected == [3, 1, 0, 2]


def test_one_relax_to_zero_one_when_the_budget_is_spent() -> None:
    samples = [N] * 6  # never a positive: [0.25, 0.75] cannot be met
    got = replay(samples, n=4, n_max=6, stride=2, p_min=0.25, p_max=0.75)
    assert (got.generated, got.selected, got.outcome) == (6, [0, 1, 2, 3], "relaxed")


def test_the_ordered_fallback_when_too_few_are_eligible() -> None:
    timed_out = RefSample(1.0, "truncated", "TimeExceeded")
    samples = [RefSample(None, "aborted"), N, timed_out, P, RefSample(None)]
    got = replay(samples, n=4, n_max=5, stride=5, p_min=0.25, p_max=0.75)
    # positives [3], negatives [1], backfill by rank: [4] (0), [2] (2), [0] (3)
    assert (got.outcome, got.selected) == ("fallback", [3, 1, 4, 2])


def test_fewer_samples_than_the_budget_end_the_run_early() -> None:
    got = replay([P, N], n=2, n_max=8, stride=4, p_min=0.5, p_max=0.5)
    assert (got.generated, got.outcome) == (2, "found")


_sample = st.builds(
    RefSample,
    st.one_of(st.none(), st.sampled_from([0.0, 1.0, 0.5, -1.0])),
    st.sampled_from(["completed", "truncated", "aborted"]),
    st.sampled_from([None, "TimeExceeded", "Other"]),
)


@st.composite
def _prompts(draw: st.DrawFn) -> tuple[list[RefSample], int, int, int, float, float]:
    n = draw(st.integers(1, 8))
    n_max = draw(st.integers(n, 24))
    stride = draw(st.integers(1, 10))
    p_min = draw(st.sampled_from([0.0, 0.125, 0.2, 0.25, 0.3, 0.5]))
    p_max = draw(st.sampled_from([0.5, 0.6, 0.75, 0.8, 1.0]))
    samples = draw(st.lists(_sample, min_size=n_max, max_size=n_max))
    return samples, n, n_max, stride, p_min, p_max


@settings(max_examples=400, deadline=None)
@given(_prompts())
def test_properties_of_a_replay(
    prompt: tuple[list[RefSample], int, int, int, float, float],
) -> None:
    samples, n, n_max, stride, p_min, p_max = prompt
    got = replay(samples, n, n_max, stride, p_min, p_max)
    assert got.generated == n_max or got.generated % stride == 0
    assert len(set(got.selected)) == len(got.selected) == min(n, got.generated)
    assert all(0 <= i < got.generated for i in got.selected)
    kinds = [classify(samples[i]) for i in got.selected]
    positives = kinds.count("positive")
    if got.outcome == "found":
        assert math.ceil(p_min * n) <= positives <= math.floor(p_max * n)
        # the first stride at which a group exists: none earlier
        for earlier in range(stride, got.generated, stride):
            assert select_group(samples[:earlier], n, p_min, p_max) is None
    if got.outcome != "fallback":
        assert "backfill" not in kinds
        assert kinds == sorted(kinds, key=lambda k: k != "positive")  # positives first
    # the driver and the replay agree decision for decision
    cfg = BarConfig(n=n, n_max=n_max, stride=stride, p_min=p_min, p_max=p_max)
    if _expressible(samples):
        strides, selected, outcome = _driven(samples, cfg)
        assert (sum(strides), selected, outcome) == (got.generated, got.selected, got.outcome)


def _expressible(samples: list[RefSample]) -> bool:
    """Whether our Sample type can carry these (a reward, and no other exit status)."""
    return all(s.reward is not None and s.exit_status in (None, "TimeExceeded") for s in samples)


def _driven(samples: list[RefSample], cfg: BarConfig) -> tuple[list[int], list[int], str]:
    """``bar_rollout`` fed ``samples`` in order: the stride sizes, the group, the outcome."""
    ours = [
        Sample(
            s.reward or 0.0,
            Status.TIME_EXCEEDED if s.timed_out else Status(s.status),
        )
        for s in samples
    ]
    asked: list[int] = []

    async def generate(k: int) -> list[Sample]:
        start = sum(asked)
        asked.append(k)
        return ours[start : start + k]

    result = asyncio.run(bar_rollout(generate, cfg))
    return asked, list(result.selected.indices), result.outcome

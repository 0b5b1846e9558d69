"""Credit-assignment SFT: rise segments of value curves and message-level samples."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_swe.algorithms.credit import (
    CreditConfig,
    FixedValues,
    Segment,
    admissible,
    assistant_positions,
    credit_samples,
    deltas,
    ema,
    moving_average,
    rise_segments,
    samples_for,
    segment_sample,
)
from orchard_swe.trajectory import Trajectory, TrajectoryMetadata

pytestmark = pytest.mark.fast


def _spans(segments: list[Segment]) -> list[tuple[int, int]]:
    return [(s.start, s.stop) for s in segments]


# ---------------------------------------------------------------- synthetic curves


@pytest.mark.parametrize(
    ("values", "delta", "epsilon", "expected"),
    [
        # a steady climb is one segment
        ([0.0, 0.1, 0.2, 0.3, 0.4, 0.5], 0.3, 0.05, [(0, 5)]),
        # too small a climb: nothing
        ([0.0, 0.1, 0.2], 0.3, 0.05, []),
        # a flat curve: nothing
        ([0.4] * 6, 0.1, 0.0, []),
        # a drop below -epsilon splits two rises
        ([0.0, 0.4, 0.5, 0.1, 0.5, 0.625], 0.3, 0.1, [(0, 2), (3, 5)]),
        # the same drop within epsilon is tolerated: one segment over all
        ([0.0, 0.4, 0.5, 0.375, 0.5, 0.625], 0.3, 0.25, [(0, 5)]),
        # flat and dipping turns at the edges are trimmed (a segment starts/ends on a rise)
        ([0.25, 0.25, 0.125, 0.5, 0.75, 0.75], 0.3, 0.25, [(2, 4)]),
        # a slow decline (each step within epsilon) eats the gain: two short segments
        (
            [0.0, 0.5] + [0.5 - 0.0625 * i for i in range(1, 13)] + [0.25],
            0.45,
            0.0625,
            [(0, 1), (13, 14)],
        ),
        # a single rising turn that reaches delta exactly
        ([0.0, 0.5], 0.5, 0.0, [(0, 1)]),
        # a drop at the very end does not hurt the rise before it
        ([0.0, 0.25, 0.5, 0.0], 0.5, 0.1, [(0, 2)]),
    ],
)
def test_synthetic_curves(
    values: list[float], delta: float, epsilon: float, expected: list[tuple[int, int]]
) -> None:
    assert _spans(rise_segments(values, delta=delta, epsilon=epsilon)) == expected


def test_overlapping_candidates_go_to_the_longest() -> None:
    # dV = 0.25, 0.25, -0.05, 0.25 (eps 0.1, delta 0.4): [0,2) gain .5, [1,4) gain .45,
    # [0,4) gain .7: the longest run wins and covers the rest
    values = [0.0, 0.25, 0.5, 0.45, 0.7]
    assert _spans(rise_segments(values, delta=0.4, epsilon=0.1)) == [(0, 4)]
    # with a drop just below -epsilon at turn 2, [0,2) and [3,4) are separate blocks
    values = [0.0, 0.25, 0.5, 0.375, 0.875]
    assert _spans(rise_segments(values, delta=0.4, epsilon=0.1)) == [(0, 2), (3, 4)]


def test_smoothing_bridges_a_noisy_dip() -> None:
    values = [0.0, 0.2, 0.4, 0.1, 0.6, 0.8]
    assert _spans(rise_segments(values, delta=0.5, epsilon=0.1)) == [(3, 5)]
    smooth = moving_average(2)
    assert smooth(values) == pytest.approx([0.0, 0.1, 0.3, 0.25, 0.35, 0.7])
    assert _spans(rise_segments(values, delta=0.5, epsilon=0.1, smoother=smooth)) == [(0, 5)]


def test_smoothers() -> None:
    values = [0.0, 1.0, 0.0, 1.0]
    assert ema(1.0)(values) == values
    assert ema(0.5)(values) == [0.0, 0.5, 0.25, 0.625]
    assert moving_average(1)(values) == values
    assert moving_average(3)(values) == pytest.approx([0.0, 0.5, 1 / 3, 2 / 3])
    with pytest.raises(ValueError):
        ema(0.0)
    with pytest.raises(ValueError):
        moving_average(0)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError):
        rise_segments([0.0, 1.0], delta=0.0, epsilon=0.1)
    with pytest.raises(ValueError):
        rise_segments([0.0, 1.0], delta=0.1, epsilon=-0.1)
    with pytest.raises(ValueError, match="non-finite"):
        rise_segments([0.0, float("nan")], delta=0.1, epsilon=0.1)
    assert rise_segments([], delta=0.1, epsilon=0.1) == []
    assert rise_segments([0.3], delta=0.1, epsilon=0.1) == []


# ---------------------------------------------------------------- properties

curves = st.lists(st.sampled_from([i / 8 for i in range(9)]) | st.floats(0, 1), max_size=22)
deltas_st = st.floats(0.01, 1.0)
epsilons = st.floats(0.0, 0.5)
smoothers = st.sampled_from([None, "ema", "ma"])


def _smoother(name: str | None) -> Any:
    return {None: None, "ema": ema(0.6), "ma": moving_average(3)}[name]


@settings(max_examples=300)
@given(values=curves, delta=deltas_st, epsilon=epsilons, smoother=smoothers)
def test_segment_properties(
    values: list[float], delta: float, epsilon: float, smoother: str | None
) -> None:
    smooth = _smoother(smoother)
    segments = rise_segments(values, delta=delta, epsilon=epsilon, smoother=smooth)
    assert segments == rise_segments(values, delta=delta, epsilon=epsilon, smoother=smooth)
    curve = smooth(values) if smooth else values
    turns = max(0, len(values) - 1)
    d = deltas(curve)
    # inside the trajectory, sorted, never overlapping
    for seg in segments:
        assert 0 <= seg.start < seg.stop <= turns
    for a, b in itertools.pairwise(segments):
        assert a.stop <= b.start
    # each respects delta and epsilon (and starts and ends on a rising turn)
    for seg in segments:
        assert admissible(curve, seg.start, seg.stop, delta, epsilon)
        assert seg.gain == curve[seg.stop] - curve[seg.start] >= delta
        assert all(d[t] >= -epsilon for t in range(seg.start, seg.stop))
    # maximal coverage: every admissible run meets a segment; the first pick is a longest one
    runs = [
        (a, b)
        for a in range(turns)
        for b in range(a + 1, turns + 1)
        if admissible(curve, a, b, delta, epsilon)
    ]
    for a, b in runs:
        assert any(s.start < b and a < s.stop for s in segments)
    if runs:
        assert max(len(s) for s in segments) == max(b - a for a, b in runs)
    else:
        assert segments == []


# ---------------------------------------------------------------- message-level samples


def _trajectory(observations: list[int], status: str | None = None) -> Trajectory:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "fix the bug"},
    ]
    for turn, n_obs in enumerate(observations):
        messages.append({"role": "assistant", "content": f"a{turn}"})
        messages.extend(
            {"role": "tool", "content": f"o{turn}.{j}", "tool_call_id": "x"} for j in range(n_obs)
        )
    meta = TrajectoryMetadata(task_id="i", harness="tools", model="m", attempt=2, verdict=status)
    return Trajectory(metadata=meta, messages=messages, tools=[{"type": "function"}])


@settings(max_examples=150)
@given(
    observations=st.lists(st.integers(0, 2), min_size=1, max_size=12),
    data=st.data(),
    delta=st.floats(0.05, 0.6),
    epsilon=st.floats(0.0, 0.3),
)
def test_masks_align_with_assistant_turns(
    observations: list[int], data: st.DataObject, delta: float, epsilon: float
) -> None:
    traj = _trajectory(observations, "unresolved")
    turns = len(observations)
    values = data.draw(st.lists(st.floats(0, 1), min_size=turns + 1, max_size=turns + 1))
    cfg = CreditConfig(delta=delta, epsilon=epsilon)
    samples = samples_for(traj, values, cfg)
    segments = rise_segments(values, delta=delta, epsilon=epsilon)
    assert [s.segment for s in samples] == segments
    positions = assistant_positions(traj.messages)
    for sample, seg in zip(samples, segments, strict=True):
        assert sample.kind == "segment" and sample.instance_id == "i" and sample.attempt == 2
        assert len(sample.loss_mask) == len(sample.messages)
        # the context is the full prefix of the trajectory, ending at the last target
        assert list(sample.messages) == traj.messages[: len(sample.messages)]
        assert len(sample.messages) == positions[seg.stop - 1] + 1
        # loss 1 exactly on the segment's assistant turns
        ones = [i for i, m in enumerate(sample.loss_mask) if m]
        assert ones == positions[seg.start : seg.stop]
        assert all(sample.messages[i]["role"] == "assistant" for i in ones)
        assert set(sample.loss_mask) <= {0, 1}
        targets = [m["content"] for m in sample.to_dict()["messages"] if m.get("weight") == 1]
        assert targets == [f"a{t}" for t in range(seg.start, seg.stop)]


def test_resolved_trajectories_stay_whole() -> None:
    traj = _trajectory([1, 0, 2], "resolved")
    [sample] = samples_for(traj, None, CreditConfig())
    assert sample.kind == "whole" and sample.segment is None
    assert list(sample.messages) == traj.messages
    assert [i for i, m in enumerate(sample.loss_mask) if m] == assistant_positions(traj.messages)
    out = sample.to_dict()
    assert [m.get("weight") for m in out["messages"]] == [None, None, 1, None, 1, 1, None, None]
    assert out["metadata"] == {"kind": "whole", "instance_id": "i", "attempt": 2}
    assert out["tools"] == [{"type": "function"}]


def test_wrong_curve_length_and_bad_segment() -> None:
    traj = _trajectory([0, 0], "unresolved")
    with pytest.raises(ValueError, match="expected 3 values"):
        samples_for(traj, [0.0, 1.0], CreditConfig())
    with pytest.raises(ValueError, match="needs a value curve"):
        samples_for(traj, None, CreditConfig())
    with pytest.raises(ValueError, match="outside"):
        segment_sample(traj, Segment(1, 3, 0.5))


class _Exploding:
    async def values(self, trajectory: Trajectory) -> list[float]:
        raise AssertionError("a resolved trajectory needs no estimate")


async def test_credit_samples_with_fixed_values() -> None:
    resolved = _trajectory([0, 1], "resolved")
    failed = _trajectory([1, 1, 1, 0], "unresolved")
    estimator = FixedValues({("i", 2): [0.1, 0.1, 0.4, 0.6, 0.2]})
    samples = await credit_samples([resolved, failed], estimator, CreditConfig(delta=0.3))
    assert [s.kind for s in samples] == ["whole", "segment"]
    assert samples[1].segment == Segment(1, 3, 0.5)
    assert (await credit_samples([resolved], _Exploding(), CreditConfig()))[0].kind == "whole"
    assert await FixedValues([0.0, 1.0]).values(failed) == [0.0, 1.0]
    custom = CreditConfig(resolved=lambda t: t.metadata.attempt == 2)
    assert [s.kind for s in await credit_samples([failed], _Exploding(), custom)] == ["whole"]

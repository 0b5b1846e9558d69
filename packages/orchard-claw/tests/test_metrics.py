"""pass@k / pass^k against hand-computed values and their properties; intervals; the table."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchard_claw.metrics import (
    Trial,
    aggregate,
    bootstrap_ci,
    compare,
    pass_at_k,
    pass_hat_k,
    per_task,
    summarize,
    wilson_interval,
)

pytestmark = pytest.mark.fast


@st.composite
def nck(draw: st.DrawFn) -> tuple[int, int, int]:
    n = draw(st.integers(1, 30))
    return n, draw(st.integers(0, n)), draw(st.integers(1, n))


def test_hand_computed_values() -> None:
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10; C(2,2)/C(5,2) = 1/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_hat_k(5, 2, 2) == pytest.approx(0.1)
    # k=1 is the success rate either way
    assert pass_at_k(4, 3, 1) == pytest.approx(0.75) == pass_hat_k(4, 3, 1)
    # n=3, c=1, k=3: one success is in every 3-draw; all three succeed never
    assert pass_at_k(3, 1, 3) == 1.0
    assert pass_hat_k(3, 1, 3) == 0.0
    # n=10, c=3, k=5: 1 - C(7,5)/C(10,5) = 1 - 21/252
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
    assert pass_hat_k(10, 8, 5) == pytest.approx(56 / 252)


def test_fewer_trials_than_k_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="n >= k"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError, match="n >= k"):
        pass_hat_k(2, 2, 3)
    with pytest.raises(ValueError, match="at least 3"):
        per_task({"t1": [True, False]}, 3)
    with pytest.raises(ValueError, match="within"):
        pass_at_k(3, 4, 1)


@given(nck())
def test_bounds_and_order(args: tuple[int, int, int]) -> None:
    n, c, k = args
    at_k, hat_k, at_1 = pass_at_k(n, c, k), pass_hat_k(n, c, k), pass_at_k(n, c, 1)
    assert 0.0 <= hat_k <= at_1 + 1e-12 <= at_k + 2e-12 <= 1.0 + 2e-12


@given(nck())
def test_monotone_in_k(args: tuple[int, int, int]) -> None:
    n, c, k = args
    if k < n:
        assert pass_at_k(n, c, k + 1) >= pass_at_k(n, c, k) - 1e-12
        assert pass_hat_k(n, c, k + 1) <= pass_hat_k(n, c, k) + 1e-12


@given(nck())
def test_monotone_in_c(args: tuple[int, int, int]) -> None:
    n, c, k = args
    if c < n:
        assert pass_at_k(n, c + 1, k) >= pass_at_k(n, c, k) - 1e-12
        assert pass_hat_k(n, c + 1, k) >= pass_hat_k(n, c, k) - 1e-12


@given(st.integers(1, 30), st.integers(1, 30))
def test_all_or_nothing(n: int, k: int) -> None:
    if k <= n:
        assert pass_at_k(n, n, k) == pass_hat_k(n, n, k) == 1.0
        assert pass_at_k(n, 0, k) == pass_hat_k(n, 0, k) == 0.0


def test_per_task_and_aggregate_mean_over_tasks() -> None:
    results = {"b": [True, True, False, False, False], "a": [True, True, True]}
    est = per_task(results, 2)
    assert [e.task_id for e in est] == ["a", "b"]
    assert (est[1].n, est[1].c) == (5, 2)
    assert est[1].pass_at_k == pytest.approx(0.7) and est[1].pass_hat_k == pytest.approx(0.1)
    agg = aggregate(est)
    assert agg["pass_at_1"] == pytest.approx((1.0 + 0.4) / 2)
    assert agg["pass_at_k"] == pytest.approx((1.0 + 0.7) / 2)
    assert agg["pass_hat_k"] == pytest.approx((1.0 + 0.1) / 2)
    trials = [Trial(task_id=t, passed=p) for t, ps in results.items() for p in ps]
    assert per_task(trials, 2) == est


def test_bootstrap_is_seeded_and_brackets_the_mean() -> None:
    values = [0.0, 0.2, 0.5, 0.9, 1.0, 1.0, 0.3]
    low, high = bootstrap_ci(values, seed=7)
    assert (low, high) == bootstrap_ci(values, seed=7)
    assert low <= sum(values) / len(values) <= high
    assert 0.0 <= low < high <= 1.0
    narrow = bootstrap_ci(values, confidence=0.5, seed=7)
    assert low <= narrow[0] <= narrow[1] <= high
    assert bootstrap_ci([0.4]) == (0.4, 0.4)
    with pytest.raises(ValueError):
        bootstrap_ci([])


def test_wilson_interval_known_values() -> None:
    # 8/10 at 95%: the textbook Wilson interval is about [0.490, 0.943]
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-3) and high == pytest.approx(0.9433, abs=1e-3)
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 0)


@given(st.integers(1, 200).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_wilson_contains_the_proportion(args: tuple[int, int]) -> None:
    n, c = args
    low, high = wilson_interval(c, n)
    assert 0.0 <= low <= c / n <= high <= 1.0


def test_summary_and_comparison_table() -> None:
    def run(harness_pass: dict[str, list[bool]], turns: int) -> list[Trial]:
        return [
            Trial(task_id=t, passed=p, turns=turns, tokens=1000 * turns, wall_time_s=2.5)
            for t, ps in harness_pass.items()
            for p in ps
        ]

    react = run({"t1": [True, True, False], "t2": [False, False, False]}, 4)
    foreign = run({"t1": [True, True, True], "t2": [True, False, True]}, 6)
    table = compare({"react": react, "openclaw": foreign}, 2, seed=1)
    assert table.columns()[:6] == ["harness", "tasks", "trials", "pass@1", "pass@2", "pass^2"]
    react_row, foreign_row = table.rows
    assert react_row.pass_at_1.value == pytest.approx((2 / 3 + 0) / 2)
    assert react_row.pass_at_k.value == pytest.approx((1.0 + 0) / 2)
    assert react_row.pass_hat_k.value == pytest.approx((1 / 3 + 0) / 2)
    assert foreign_row.pass_hat_k.value == pytest.approx((1.0 + 1 / 3) / 2)
    assert react_row.mean_turns == 4 and react_row.total_tokens == 24000
    assert react_row.mean_tokens == 4000 and react_row.mean_wall_time_s == 2.5
    cells = table.cells()
    assert cells[0][0] == "react" and cells[0][3].startswith("0.33 [")
    assert json.loads(json.dumps(table.to_dict()))["rows"][1]["harness"] == "openclaw"
    with pytest.raises(ValueError, match="other tasks"):
        compare({"a": react, "b": foreign[:3]}, 2)
    with pytest.raises(ValueError, match="at least 4"):
        summarize("react", react, 4)


def test_fast_on_a_realistic_table() -> None:
    trials = [Trial(task_id=f"t{i}", passed=(i * j) % 3 == 0) for i in range(200) for j in range(8)]
    row = summarize("react", trials, 8)
    assert row.tasks == 200 and math.isfinite(row.pass_at_k.low)

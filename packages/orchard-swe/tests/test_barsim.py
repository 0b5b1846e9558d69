"""bar-sim: the event simulation, the three methods' invariants, and the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_swe.algorithms.bar import Sample, Status
from orchard_swe.algorithms.barsim import (
    Cluster,
    Draw,
    PromptStream,
    SimConfig,
    run_sim,
)
from orchard_swe.cli import main

pytestmark = pytest.mark.fast

SMALL = SimConfig(steps=3, batch=8, tasks=50, workers=32)


def test_cluster_schedules_fifo_on_its_workers() -> None:
    draws = [Draw(t, Sample(1.0)) for t in (3.0, 1.0, 2.0, 4.0)]
    done: list[list[Sample]] = []
    one = Cluster(1)
    one.submit(draws, done.append)
    one.run()
    assert one.now == 10.0 and one.samples == 4 and len(done) == 1
    many = Cluster(8)
    many.submit(draws, done.append)
    many.run()
    assert many.now == 4.0
    two = Cluster(2)
    two.submit(draws, done.append)
    two.run()
    assert two.now == 3.0 + 4.0  # slots free at 1 (-> 2.0 job, ends 3), at 3 (-> 4.0 job)


def test_prompt_stream_is_seeded_and_shared() -> None:
    a, b = PromptStream(SMALL), PromptStream(SMALL)
    assert a.rates == b.rates
    assert [a.draw(5, i) for i in range(10)] == [b.draw(5, i) for i in reversed(range(10))][::-1]
    assert PromptStream(SimConfig(seed=1)).rates != PromptStream(SimConfig(seed=2)).rates


def test_prompt_stream_statuses() -> None:
    cfg = SimConfig(p_truncated=0.3, p_aborted=0.2, latency_median=100, timeout=150)
    stream = PromptStream(cfg)
    draws = [stream.draw(s, i) for s in range(20) for i in range(20)]
    statuses = {d.sample.status for d in draws}
    assert statuses == set(Status)
    assert all(d.latency <= cfg.timeout for d in draws)
    assert all(d.sample.reward == 0.0 for d in draws if d.sample.status != Status.COMPLETED)


def test_run_is_deterministic_and_consistent() -> None:
    results = run_sim(SMALL)
    assert [r.to_dict() for r in results] == [r.to_dict() for r in run_sim(SMALL)]
    grpo, dapo, *bars = results
    total = SMALL.steps * SMALL.batch
    assert (grpo.prompts, grpo.samples, grpo.groups) == (total, total * SMALL.n, total)
    assert grpo.useful == grpo.groups - grpo.zero_adv_groups
    assert dapo.useful == total or dapo.detail["short_steps"] > 0
    assert dapo.samples == dapo.prompts * SMALL.n
    for bar in bars:  # the reference's rules and ours
        assert bar.prompts == bar.groups == total
        assert total * SMALL.n <= bar.samples <= total * SMALL.n_max
        assert sum(bar.detail.values()) == total
    for r in results:
        assert 0 <= r.zero_adv_share <= 1 and 0 <= r.balanced_share <= 1
        assert r.balanced <= r.useful <= r.groups and r.wall_s > 0


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 1000),
    alpha=st.floats(0.2, 3),
    beta=st.floats(0.2, 3),
    workers=st.integers(1, 64),
)
def test_invariants_over_settings(seed: int, alpha: float, beta: float, workers: int) -> None:
    cfg = SimConfig(
        seed=seed,
        alpha=alpha,
        beta=beta,
        workers=workers,
        steps=2,
        batch=4,
        tasks=20,
        dapo_max_rounds=3,
    )
    grpo, dapo, *bars = run_sim(cfg)
    assert dapo.useful <= cfg.steps * cfg.batch
    if dapo.detail["short_steps"] == 0:
        assert dapo.useful == cfg.steps * cfg.batch
    for bar in bars:  # a group needs n samples, so BAR never spends less than GRPO
        assert bar.samples >= grpo.samples
        assert bar.samples <= cfg.steps * cfg.batch * cfg.n_max


def test_everyone_passes_or_fails() -> None:
    easy = SimConfig(alpha=50, beta=0.01, p_truncated=0, p_aborted=0, timeout=1e9, steps=2, batch=4)
    grpo, _, bar, ours = run_sim(easy, ("grpo", "dapo", "bar", "bar-orchard"))
    for b in (bar, ours):
        assert grpo.zero_adv_share == 1.0 and b.zero_adv_share == 1.0
        assert b.samples == 2 * 4 * easy.n_max and b.useful == 0
    assert bar.detail["relaxed"] == 8  # the reference's one relax, to [0, 1], always fits
    assert ours.detail["fallback"] == 8  # ours relaxes only to [1/n, 1 - 1/n]


def test_bad_config() -> None:
    with pytest.raises(ValueError):
        SimConfig(batch=0)
    with pytest.raises(ValueError):
        SimConfig(p_truncated=0.7, p_aborted=0.5)
    with pytest.raises(ValueError):
        SimConfig(n=4, p_min=0.3, p_max=0.45)
    with pytest.raises(ValueError, match="unknown"):
        run_sim(SMALL, ("ppo",))


def test_cli_json_table_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ["bar-sim", "--steps", "2", "--batch", "4", "--seed", "3"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["steps"] == 2 and out["config"]["seed"] == 3
    assert [r["method"] for r in out["results"]] == ["grpo", "dapo", "bar", "bar-orchard"]
    assert main([*args, "--methods", "bar", "--plot", str(tmp_path / "p.png")]) == 0
    captured = capsys.readouterr()
    assert "bar-sim" in captured.out and "rollouts/useful" in captured.out
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["bar-sim", "--n", "4", "--p-min", "0.3", "--p-max", "0.45"]) == 2


def test_cli_plot_without_matplotlib(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    args = ["bar-sim", "--steps", "1", "--batch", "2", "--plot", str(tmp_path / "p.png")]
    assert main(args) == 2
    assert "orchard-swe[plot]" in capsys.readouterr().err.replace("\n", "")
    assert not (tmp_path / "p.png").exists()

"""Figures and baselines built without a server: the arithmetic of a figure, and the bare
commands the create bench times beside Orchard's (their shape, not their times)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard_env_bench.create import bwrap_true_argv, docker_agent_argv
from orchard_env_bench.leaks import LEAK_KINDS, count_leaks
from orchard_env_bench.targets import figure

pytestmark = pytest.mark.fast


def test_figure_ratio_and_target_in_both_senses():
    low = figure("p99", 6000.0, "ms", baseline=24000.0, target=8000.0)
    assert low["ratio"] == 0.25 and low["met"] is True and low["target_text"] == "≤ 8000 ms"
    high = figure("rate", 300.0, "/s", baseline=141.0, target=423.0, sense="min")
    assert high["met"] is False and round(high["ratio"], 2) == 2.13
    free = figure("growth", 3.0, "KiB", target_text="flat")
    assert free["met"] is None and free["ratio"] is None


def test_bare_bwrap_runs_true_with_the_holders_namespaces(tmp_path: Path):
    argv = bwrap_true_argv(tmp_path, None, {"info": 5, "seccomp": -1})
    assert argv[-2:] == ["--", "/bin/true"] and "--seccomp" not in argv
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-net", "--proc", "--dev"):
        assert flag in argv
    assert str(tmp_path / "workspace") in argv
    with_filter = bwrap_true_argv(tmp_path, None, {"info": 5, "seccomp": 6})
    assert with_filter[with_filter.index("--seccomp") + 1] == "6"


def test_docker_baseline_starts_the_agent_like_the_backend(tmp_path: Path):
    argv = docker_agent_argv("orchard-test/debian", "orchard-agent-x", tmp_path, "n")
    assert argv[:3] == ["docker", "run", "-d"] and "orchard-test/debian" in argv
    assert "orchard_env_agent" in argv and "--uds" in argv
    assert any("dst=/.orchard/agent,readonly" in a for a in argv)


def test_leak_count_of_an_empty_state_dir_is_zero(tmp_path: Path):
    (tmp_path / "sandboxes").mkdir()
    counts = count_leaks(tmp_path, 2**22 + 1, set(), registry=tmp_path / "none")
    assert set(counts) == set(LEAK_KINDS) and not any(counts.values())

"""The benches run end to end and report what the docs promise (shapes, never times): by
``orchard-env-bench``, and by ``orchard-env bench`` and ``orchard-env cost``, which hand over
to it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchard_env_bench.cli import main as bench_main
from orchard_env_server.cli import main
from orchard_testing import only_backend

pytestmark = [pytest.mark.integration, only_backend("local")]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert bench_main([*argv, "--json"]) == 0
    result: dict[str, object] = json.loads(capsys.readouterr().out)
    return result


def test_latency_reports_the_three_paths_ratios_and_file_throughput(backend, capsys, tmp_path):
    plot = tmp_path / "latency.png"
    result = _run(capsys, "latency", "--runs", "5", "--file-runs", "1", "--plot", str(plot))
    for path in ("orchard", "orchard_http", "agent_direct", "baseline"):
        assert {"p50_ms", "p90_ms", "p99_ms"} <= set(result[path])  # type: ignore[arg-type]
    assert result["ratio_p50"] and result["orchestrator_overhead_p50_ms"] is not None
    assert result["agent_vs_baseline_p50"]  # agent-side exec beside bash -c (issue 21)
    assert result["figures"][0]["target"] == 1.5  # type: ignore[index]
    files = result["files"]
    assert isinstance(files, dict) and set(files) == {"1MiB", "100MiB"}
    assert all(r["upload_mb_s"] > 0 and r["download_mb_s"] > 0 for r in files.values())
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_bridge_reports_both_paths_and_their_ratio(backend, capsys, tmp_path):
    plot = tmp_path / "bridge.png"
    result = _run(capsys, "bridge", "--runs", "5", "--plot", str(plot))
    for path in ("orchard", "baseline"):
        assert {"p50_ms", "p90_ms", "p99_ms"} <= set(result[path])  # type: ignore[arg-type]
    assert result["ratio_p50"] and result["overhead_p50_ms"] is not None
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_concurrency_counts_every_command_and_leaves_nothing(backend, capsys, tmp_path):
    plot = tmp_path / "concurrency.png"
    result = _run(
        capsys,
        "concurrency",
        "--sandboxes",
        "6",
        "--commands",
        "3",
        "--connections",
        "4",
        "--plot",
        str(plot),
    )
    assert result["success_rate"] == 1.0 and result["errors"] == []
    assert result["commands_run"] == 18 and result["sandboxes_left_after_delete"] == 0
    assert result["commands_per_s"] > 0 and result["wall_s"] > 0
    assert result["per_sandbox_memory_bytes"] is not None and result["orchestrator_peak_rss_bytes"]
    assert "_memory_series" not in result
    assert plot.read_bytes().startswith(b"\x89PNG")
    # issue 21's figures: whole run, delete wall, RSS at start, and nothing left behind
    assert result["commands_per_s_whole_run"] > 0 and result["delete_wall_s"] is not None
    assert result["orchestrator_start_rss_bytes"]
    assert result["orchestrator_rss_growth_per_sandbox_bytes"] is not None
    leaks = result["leaks"]
    assert isinstance(leaks, dict)
    assert set(leaks["after"]) == {
        "processes",
        "cgroup_dirs",
        "mounts",
        "sandbox_dirs",
        "uid_claims",
    }
    assert leaks["after"] == dict.fromkeys(leaks["after"], 0) and result["leaks_total"] == 0
    names = {f["name"] for f in result["figures"]}  # type: ignore[attr-defined]
    assert {"delete all, client wall time", "create → ready p99, all at once"} <= names


def test_create_and_cost_from_a_bench_result(backend, capsys, tmp_path: Path):
    assert main(["bench", "create", "--runs", "3", "--warm-pool", "2", "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    pool = created["warm_pool"]  # claims from a server of its own with --warm-pool host=2
    assert pool["size"] == 2 and {"p50_ms"} <= set(pool["ready"]) <= set(pool["orchard"])
    assert pool["pss_per_pooled_sandbox_bytes"] is not None
    assert "warm pool" in " ".join(f["name"] for f in created["figures"])
    assert {"p50_ms", "p99_ms"} <= set(created["orchard"])  # type: ignore[arg-type]
    # the local baseline is a bare bwrap of /bin/true, interleaved with Orchard's creates
    assert {"p50_ms", "p99_ms"} <= set(created["baseline"]) and created["ratio_p50"]
    assert "bwrap" in created["baseline_name"]
    assert created["figures"][0]["name"] == "local create → ready p50"
    bench = _run(capsys, "concurrency", "--sandboxes", "2", "--commands", "1")
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    assert (
        main(
            [
                "cost",
                "--sandboxes",
                "100",
                "--hours",
                "2",
                "--from-bench",
                str(tmp_path / "bench.json"),
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)

"""``orchard-env cost``: the cost model, the bench-derived density and the command line
(the server's ``orchard-env cost``, which hands over to this package, and ours)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchard_env_bench import cost
from orchard_env_bench.cli import main as bench_main
from orchard_env_bench.cost import (
    DEFAULT_SOURCES,
    GIB,
    CostInputError,
    ManagedPrice,
    NodeShape,
    Workload,
    estimate,
    load_bench,
    per_node_by_packing,
    per_node_explicit,
    per_node_from_bench,
)
from orchard_env_server.cli import main

pytestmark = pytest.mark.fast

NODE = NodeShape(8, 32, 0.4, 0.16, "test node")
MANAGED = ManagedPrice(0.00001, 0.000002, "test managed")


def bench_json(**overrides: object) -> dict[str, object]:
    data: dict[str, object] = {
        "sandboxes": 100,
        "success_rate": 1.0,
        "commands_per_s": 500.0,
        "wall_s": 30.0,
        "orchestrator_peak_rss_bytes": 200 * 2**20,
        "per_sandbox_rss_bytes": 20 * 2**20,
        "machine": {"cpu_count": 2, "memory_total_bytes": 8 * GIB},
    }
    data.update(overrides)
    return data


def write(tmp_path: Path, data: object, name: str = "bench.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


# --- the model ------------------------------------------------------------------------------


def test_hand_computed_example():
    work = Workload(sandboxes=10, hours=2, vcpu_per_sandbox=1, gib_per_sandbox=2)
    report = estimate(work, NODE, MANAGED, per_node_explicit(4))
    assert report.nodes == 3  # ceil(10 / 4)
    assert report.node_hours == 6
    assert report.self_hosted_on_demand_usd == pytest.approx(6 * 0.4)
    assert report.self_hosted_spot_usd == pytest.approx(6 * 0.16)
    seconds = 10 * 2 * 3600
    assert report.managed_vcpu_seconds == pytest.approx(seconds * 1)
    assert report.managed_gib_seconds == pytest.approx(seconds * 2)
    managed = seconds * 0.00001 + seconds * 2 * 0.000002
    assert report.managed_usd == pytest.approx(managed)
    assert report.managed_to_on_demand == pytest.approx(managed / 2.4)
    assert report.managed_to_spot == pytest.approx(managed / 0.96)
    assert report.on_demand_usd_per_sandbox_hour == pytest.approx(2.4 / 20)
    assert report.managed_usd_per_sandbox_hour == pytest.approx(managed / 20)


def test_per_sandbox_fee_is_added_per_sandbox_second():
    work = Workload(sandboxes=3, hours=1, vcpu_per_sandbox=1, gib_per_sandbox=1)
    fee = ManagedPrice(0, 0, "fee only", usd_per_sandbox_second=0.001)
    assert estimate(work, NODE, fee).managed_usd == pytest.approx(3 * 3600 * 0.001)


def test_free_self_hosting_has_no_ratio():
    free = NodeShape(8, 32, 0, 0, "free")
    report = estimate(Workload(1, 1), free, MANAGED)
    assert report.managed_to_on_demand is None and report.managed_to_spot is None
    json.dumps(report.to_dict())  # still serialisable


def test_packing_is_bound_by_the_scarcer_resource():
    assert per_node_by_packing(Workload(1, 1, 1, 2), NODE).sandboxes == 8  # cpu-bound
    assert per_node_by_packing(Workload(1, 1, 0.5, 8), NODE).sandboxes == 4  # memory-bound
    assert per_node_by_packing(Workload(1, 1, 0.1, 0.1), NODE).sandboxes == 80  # no float loss
    with pytest.raises(CostInputError, match="does not fit"):
        per_node_by_packing(Workload(1, 1, 16, 1), NODE)


def test_defaults_are_packed_and_every_default_names_its_source_and_date():
    report = estimate(Workload(sandboxes=1000, hours=24))
    assert report.per_node.method == "packing"
    for key, source in DEFAULT_SOURCES.items():
        assert source.source and source.as_of, key
        assert source.status in ("published", "derived", "assumption"), key
    assert DEFAULT_SOURCES["spot_usd_per_hour"].status == "assumption"


@pytest.mark.parametrize(
    "make",
    [
        lambda: Workload(sandboxes=0, hours=1),
        lambda: Workload(sandboxes=-5, hours=1),
        lambda: Workload(sandboxes=1.5, hours=1),  # type: ignore[arg-type]
        lambda: Workload(sandboxes=True, hours=1),  # type: ignore[arg-type]
        lambda: Workload(sandboxes=1, hours=-1),
        lambda: Workload(sandboxes=1, hours=math.nan),
        lambda: Workload(sandboxes=1, hours=1, vcpu_per_sandbox=0),
        lambda: Workload(sandboxes=1, hours=1, gib_per_sandbox=-1),
        lambda: NodeShape(vcpus=0),
        lambda: NodeShape(memory_gib=-32),
        lambda: NodeShape(on_demand_usd_per_hour=-0.1),
        lambda: NodeShape(spot_usd_per_hour=math.inf),
        lambda: ManagedPrice(usd_per_vcpu_second=-1),
        lambda: ManagedPrice(usd_per_gib_second=-1),
        lambda: per_node_explicit(0),
    ],
)
def test_bad_numbers_are_clear_errors(make):
    with pytest.raises(CostInputError):
        make()


# --- properties -----------------------------------------------------------------------------

sandboxes = st.integers(min_value=1, max_value=100_000)
hours = st.floats(min_value=0.01, max_value=10_000, allow_nan=False)
prices = st.floats(min_value=0, max_value=100, allow_nan=False)
sizes = st.floats(min_value=0.05, max_value=64, allow_nan=False)
per_node = st.integers(min_value=1, max_value=1000)


@given(sandboxes, sandboxes, hours, per_node)
def test_cost_never_falls_when_sandboxes_grow(a, b, h, p):
    small, large = sorted((a, b))
    x = estimate(Workload(small, h, 1, 1), NODE, MANAGED, per_node_explicit(p))
    y = estimate(Workload(large, h, 1, 1), NODE, MANAGED, per_node_explicit(p))
    assert x.nodes <= y.nodes
    assert x.self_hosted_on_demand_usd <= y.self_hosted_on_demand_usd
    assert x.self_hosted_spot_usd <= y.self_hosted_spot_usd
    assert x.managed_usd <= y.managed_usd


@given(sandboxes, hours, hours, per_node)
def test_cost_never_falls_when_hours_grow(s, a, b, p):
    short, long = sorted((a, b))
    x = estimate(Workload(s, short, 1, 1), NODE, MANAGED, per_node_explicit(p))
    y = estimate(Workload(s, long, 1, 1), NODE, MANAGED, per_node_explicit(p))
    assert x.self_hosted_on_demand_usd <= y.self_hosted_on_demand_usd
    assert x.self_hosted_spot_usd <= y.self_hosted_spot_usd
    assert x.managed_usd <= y.managed_usd


@given(sandboxes, hours, prices, prices, per_node)
def test_spot_is_no_dearer_when_its_price_is_not(s, h, a, b, p):
    spot_price, on_demand_price = sorted((a, b))
    node = NodeShape(8, 32, on_demand_price, spot_price)
    report = estimate(Workload(s, h, 1, 1), node, MANAGED, per_node_explicit(p))
    assert report.self_hosted_spot_usd <= report.self_hosted_on_demand_usd
    assert report.spot_usd_per_sandbox_hour <= report.on_demand_usd_per_sandbox_hour


@given(sandboxes, hours, per_node)
def test_nodes_hold_every_sandbox_and_no_node_is_spare(s, h, p):
    report = estimate(Workload(s, h, 1, 1), NODE, MANAGED, per_node_explicit(p))
    assert report.nodes * p >= s
    assert (report.nodes - 1) * p < s


@given(sandboxes, hours, sizes, sizes)
def test_packing_fits_the_node(s, h, vcpu, gib):
    work = Workload(s, h, vcpu, gib)
    try:
        packed = per_node_by_packing(work, NODE)
    except CostInputError:
        assert vcpu > NODE.vcpus or gib > NODE.memory_gib
        return
    assert packed.sandboxes * vcpu <= NODE.vcpus * (1 + 1e-6)
    assert packed.sandboxes * gib <= NODE.memory_gib * (1 + 1e-6)
    report = estimate(work, NODE, MANAGED, packed)
    assert report.nodes * packed.sandboxes >= s


# --- bench-derived density ------------------------------------------------------------------


def test_bench_on_a_small_machine_is_not_scaled_up_to_a_big_node(tmp_path):
    bench = load_bench(write(tmp_path, bench_json()))
    per_node = per_node_from_bench(bench, NODE)  # 32 GiB node vs 8 GiB machine
    assert per_node.method == "bench"
    assert per_node.sandboxes == 100  # bounded by what was proven


def test_bench_is_scaled_down_to_a_smaller_node(tmp_path):
    bench = load_bench(write(tmp_path, bench_json()))
    small = NodeShape(vcpus=2, memory_gib=4, name="half")
    assert per_node_from_bench(bench, small).sandboxes == 50  # 4 GiB / 8 GiB of 100
    one_cpu = NodeShape(vcpus=1, memory_gib=8, name="one cpu")
    assert per_node_from_bench(bench, one_cpu).sandboxes == 50  # 1 CPU / 2 CPUs of 100


def test_bench_memory_fit_caps_density(tmp_path):
    heavy = bench_json(per_sandbox_rss_bytes=1 * GIB, orchestrator_peak_rss_bytes=0)
    node = NodeShape(vcpus=8, memory_gib=8)
    assert per_node_from_bench(load_bench(write(tmp_path, heavy)), node).sandboxes == 8
    tight = bench_json(per_sandbox_rss_bytes=1 * GIB, orchestrator_peak_rss_bytes=GIB // 2)
    assert per_node_from_bench(load_bench(write(tmp_path, tight)), node).sandboxes == 7
    huge = bench_json(per_sandbox_rss_bytes=64 * GIB)
    with pytest.raises(CostInputError, match="less than one sandbox"):
        per_node_from_bench(load_bench(write(tmp_path, huge)), node)


def test_bench_list_keeps_the_largest_level_proven_at_full_success(tmp_path):
    levels = [
        bench_json(sandboxes=50),
        bench_json(sandboxes=200),
        bench_json(sandboxes=400, success_rate=0.97),
    ]
    assert load_bench(write(tmp_path, levels)).sandboxes == 200


def test_bench_field_names_of_the_concurrency_bench_are_accepted(tmp_path):
    data = bench_json(orchestrator_peak_rss_bytes=None, per_sandbox_memory_bytes=10 * 2**20)
    del data["per_sandbox_rss_bytes"]
    bench = load_bench(write(tmp_path, data))
    assert bench.per_sandbox_rss_bytes == 10 * 2**20
    assert bench.orchestrator_peak_rss_bytes == 0


@pytest.mark.parametrize(
    ("machine", "pss", "counted"),
    [(0, 3 * 2**20, 3 * 2**20), (5 * 2**20, 2 * 2**20, 5 * 2**20), (4 * 2**20, None, 4 * 2**20)],
)
def test_the_larger_of_the_benchs_two_memory_figures_counts(tmp_path, machine, pss, counted):
    """A machine-wide delta drowned in noise (0) does not hide what the server tree's PSS
    measured, and a PSS that misses kernel memory does not undercut the machine's figure."""
    data = bench_json(per_sandbox_memory_bytes=machine, per_sandbox_pss_bytes=pss)
    del data["per_sandbox_rss_bytes"]
    assert load_bench(write(tmp_path, data)).per_sandbox_rss_bytes == counted


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ("[]", "no concurrency level"),
        ('"text"', "expected a JSON object"),
        (json.dumps(bench_json(success_rate=0.99)), "no concurrency level finished"),
        (json.dumps(bench_json(success_rate=2)), "within 0..1"),
        (json.dumps(bench_json(sandboxes="many")), "'sandboxes' must be a whole number"),
        (json.dumps(bench_json(per_sandbox_rss_bytes=0)), "must be above 0"),
        (json.dumps(bench_json(machine=None)), "missing object 'machine'"),
        (json.dumps(bench_json(machine={"cpu_count": 2})), "missing field 'memory_total_bytes'"),
        (json.dumps({k: v for k, v in bench_json().items() if k != "wall_s"}), "'wall_s'"),
    ],
)
def test_invalid_bench_files_are_clear_errors(tmp_path, content, message):
    path = tmp_path / "bench.json"
    path.write_text(content)
    with pytest.raises(CostInputError, match=message):
        load_bench(path)


def test_missing_bench_file_is_a_clear_error(tmp_path):
    with pytest.raises(CostInputError, match="no such file"):
        load_bench(tmp_path / "absent.json")


# --- the command line -----------------------------------------------------------------------


def run_json(capsys, *argv: str) -> dict:
    assert main(["cost", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_json_with_explicit_inputs(capsys):
    out = run_json(
        capsys,
        "--sandboxes",
        "10",
        "--hours",
        "2",
        "--vcpu-per-sandbox",
        "1",
        "--gib-per-sandbox",
        "2",
        "--node-vcpus",
        "8",
        "--node-memory-gib",
        "32",
        "--on-demand-usd-per-hour",
        "0.4",
        "--spot-usd-per-hour",
        "0.16",
        "--managed-usd-per-vcpu-second",
        "0.00001",
        "--managed-usd-per-gib-second",
        "0.000002",
        "--sandboxes-per-node",
        "4",
    )
    assert out["nodes"] == 3
    assert out["self_hosted_on_demand_usd"] == pytest.approx(2.4)
    assert out["managed_usd"] == pytest.approx(72000 * 0.00001 + 144000 * 0.000002)
    assert out["per_node"]["method"] == "explicit"
    assert out["sources"]["on_demand_usd_per_hour"]["status"] == "given"
    assert out["node"]["name"] == "custom node"


def test_cli_json_defaults_carry_their_sources(capsys):
    out = run_json(capsys, "--sandboxes", "1000", "--hours", "24")
    assert out["per_node"]["method"] == "packing"
    spot = out["sources"]["spot_usd_per_hour"]
    assert spot["status"] == "assumption" and spot["as_of"]
    assert out["sources"]["managed_usd_per_vcpu_second"]["source"].startswith("https://")
    assert out["node"]["name"] == cost.DEFAULT_NODE_NAME


def test_cli_from_bench(capsys, tmp_path):
    path = write(tmp_path, bench_json(sandboxes=60))
    out = run_json(capsys, "--sandboxes", "120", "--hours", "1", "--from-bench", str(path))
    assert out["per_node"]["method"] == "bench"
    assert out["per_node"]["sandboxes"] == 60
    assert out["nodes"] == 2
    assert out["sources"]["sandboxes_per_node"]["source"] == str(path)


def test_cli_table_prints(capsys):
    assert main(["cost", "--sandboxes", "5", "--hours", "1"]) == 0
    text = capsys.readouterr().out
    assert "self-hosted, spot" in text and "managed" in text and "assumption" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sandboxes", "-3", "--hours", "1"], "sandboxes must be"),
        (["--sandboxes", "3", "--hours", "0"], "hours must be"),
        (["--sandboxes", "3", "--hours", "1", "--spot-usd-per-hour", "-1"], "spot USD"),
        (["--sandboxes", "3", "--hours", "1", "--sandboxes-per-node", "0"], "per node"),
        (["--sandboxes", "3", "--hours", "1", "--vcpu-per-sandbox", "64"], "does not fit"),
        (["--sandboxes", "3", "--hours", "1", "--from-bench", "/nonexistent/b.json"], "no such"),
    ],
)
def test_cli_bad_input_exits_2_with_a_message(capsys, argv, message):
    assert main(["cost", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "orchard-env cost: error:" in captured.err and message in captured.err


def test_cli_rejects_both_density_sources(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "cost",
                "--sandboxes",
                "1",
                "--hours",
                "1",
                "--sandboxes-per-node",
                "2",
                "--from-bench",
                str(tmp_path / "b.json"),
            ]
        )
    assert exit_info.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


def test_orchard_env_bench_cost_is_the_same_command(capsys):
    argv = ["--sandboxes", "5", "--hours", "1", "--json"]
    assert bench_main(["cost", *argv]) == 0
    ours = json.loads(capsys.readouterr().out)
    assert main(["cost", *argv]) == 0
    assert json.loads(capsys.readouterr().out) == ours
    assert bench_main(["cost", "--sandboxes", "3", "--hours", "0"]) == 2
    assert "orchard-env-bench cost: error: hours must be" in capsys.readouterr().err


def test_the_orchard_env_bench_subcommand_has_no_cost(capsys):
    """``orchard-env bench`` lists the benches only: the cost model is ``orchard-env cost``."""
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "cost", "--sandboxes", "1", "--hours", "1"])
    assert exit_info.value.code == 2
    assert "orchard-env bench: error: argument bench: invalid choice: 'cost'" in (
        capsys.readouterr().err.replace("\n", " ")
    )

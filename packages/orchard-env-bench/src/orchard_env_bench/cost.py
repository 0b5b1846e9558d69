"""``orchard-env cost``: what a sandbox fleet costs self-hosted next to a managed service.

The model (``docs/cost.md`` has the long form):

* **Workload**: ``sandboxes`` running at once for ``hours``, each sized ``vcpu_per_sandbox``
  vCPUs and ``gib_per_sandbox`` GiB (the size a managed service bills for).
* **Self-hosted**: ``nodes = ceil(sandboxes / sandboxes_per_node)`` nodes of one
  :class:`NodeShape`, each billed whole for every hour, on-demand or spot:
  ``nodes * hours * usd_per_hour``.
* **Managed**: billed per second on the allocated size:
  ``vcpu_seconds * usd_per_vcpu_second + gib_seconds * usd_per_gib_second``
  (+ an optional flat fee per sandbox-second), where
  ``vcpu_seconds = sandboxes * hours * 3600 * vcpu_per_sandbox`` and likewise for GiB.

``sandboxes_per_node`` comes from one of three places (:class:`PerNode` records which):
given explicitly; derived from a ``bench concurrency --json`` result
(:func:`per_node_from_bench`); or, by default, packed from the allocated size
(:func:`per_node_by_packing`).

Every default price sits in :data:`DEFAULT_SOURCES` with where it came from, when, and
whether it was quoted from the vendor, derived, or assumed. Pass your own prices: list
prices change and your discounts are not in them.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

GIB = 1024**3
SECONDS_PER_HOUR = 3600
_EPSILON = 1e-9  # keeps floor(8.0 / 0.1 ...) style divisions from losing a whole sandbox

Status = Literal["published", "derived", "assumption"]


class CostInputError(ValueError):
    """An input the calculator cannot use: a negative number, a missing or invalid file."""


@dataclass(frozen=True)
class PriceSource:
    """One default value and where it came from.

    ``status`` is ``published`` (quoted from the vendor's own page), ``derived`` (computed
    from a published figure, the derivation in ``note``) or ``assumption`` (not verified:
    pass your own).
    """

    value: float
    unit: str
    status: Status
    source: str
    as_of: str
    note: str = ""


#: The defaults, each with its source and date. Checked on 2026-12-03 from stored copies of
#: the pages named (no live browsing): prices change, so treat every row as a starting point.
DEFAULT_SOURCES: dict[str, PriceSource] = {
    "node_vcpus": PriceSource(
        8,
        "vCPU",
        "derived",
        "https://aws.amazon.com/ec2/instance-types/m7i/",
        "2026-12-03",
        "AWS m7i.2xlarge, a typical general-purpose 8 vCPU / 32 GiB VM; the size as third-party "
        "listings and templates give it, not read from AWS's own page",
    ),
    "node_memory_gib": PriceSource(
        32,
        "GiB",
        "derived",
        "https://aws.amazon.com/ec2/instance-types/m7i/",
        "2026-12-03",
        "AWS m7i.2xlarge (as for node_vcpus)",
    ),
    "on_demand_usd_per_hour": PriceSource(
        0.4032,
        "USD/hour",
        "derived",
        "https://www.doit.com/blog/aws-ec2-pricing",
        "2026-12-03",
        "that page (undated in the stored copy) quotes m7i.large at $0.1008/h on-demand, Linux, "
        "us-east-1; EC2 prices the sizes of one family linearly and a 2xlarge is 4 larges, so "
        "4 * $0.1008 (third-party code uses the same 0.4032). Not read from AWS's own price "
        "list: check https://aws.amazon.com/ec2/pricing/on-demand/",
    ),
    "spot_usd_per_hour": PriceSource(
        0.1613,
        "USD/hour",
        "assumption",
        "none: spot prices move daily per zone",
        "2026-12-03",
        "an assumed 60% discount off the on-demand price above (AWS advertises 'up to 90%'); "
        "not a quoted price: pass --spot-usd-per-hour from your own spot price history",
    ),
    "managed_usd_per_vcpu_second": PriceSource(
        0.000014,
        "USD/vCPU-second",
        "published",
        "https://e2b.dev/docs/faq/calculate-sandbox-price",
        "2026-12-03",
        "E2B's usage-based rate ($0.0504 per vCPU-hour) from its docs page added in "
        "e2b-dev/docs PR #330 (merged 2026-08-06); the page says e2b.dev/pricing is the "
        "source of truth and rates can change",
    ),
    "managed_usd_per_gib_second": PriceSource(
        0.0000045,
        "USD/GiB-second",
        "published",
        "https://e2b.dev/docs/faq/calculate-sandbox-price",
        "2026-12-03",
        "E2B, usage-based rate ($0.0162 per GiB-hour)",
    ),
    "vcpu_per_sandbox": PriceSource(
        2,
        "vCPU",
        "published",
        "https://e2b.dev/docs/faq/calculate-sandbox-price",
        "2026-12-03",
        "E2B's default sandbox size, so the managed side prices what one gets by default",
    ),
    "gib_per_sandbox": PriceSource(
        0.5,
        "GiB",
        "published",
        "https://e2b.dev/docs/faq/calculate-sandbox-price",
        "2026-12-03",
        "E2B's default sandbox: 512 MiB",
    ),
}

DEFAULT_NODE_NAME = "aws m7i.2xlarge (us-east-1, Linux)"
DEFAULT_MANAGED_NAME = "e2b (usage-based)"


def _default(key: str) -> float:
    return DEFAULT_SOURCES[key].value


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise CostInputError(message)


def _finite(value: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _positive(name: str, value: float) -> None:
    _require(_finite(value) and value > 0, f"{name} must be a number above zero, not {value!r}")


def _non_negative(name: str, value: float) -> None:
    _require(_finite(value) and value >= 0, f"{name} must be zero or more, not {value!r}")


@dataclass(frozen=True)
class NodeShape:
    """A self-hosted node: its size and hourly prices (on-demand and spot)."""

    vcpus: float = _default("node_vcpus")
    memory_gib: float = _default("node_memory_gib")
    on_demand_usd_per_hour: float = _default("on_demand_usd_per_hour")
    spot_usd_per_hour: float = _default("spot_usd_per_hour")
    name: str = DEFAULT_NODE_NAME

    def __post_init__(self) -> None:
        _positive("node vCPUs", self.vcpus)
        _positive("node memory (GiB)", self.memory_gib)
        _non_negative("on-demand USD per hour", self.on_demand_usd_per_hour)
        _non_negative("spot USD per hour", self.spot_usd_per_hour)


@dataclass(frozen=True)
class ManagedPrice:
    """A managed sandbox service's per-second prices on allocated vCPU and memory."""

    usd_per_vcpu_second: float = _default("managed_usd_per_vcpu_second")
    usd_per_gib_second: float = _default("managed_usd_per_gib_second")
    name: str = DEFAULT_MANAGED_NAME
    usd_per_sandbox_second: float = 0.0  # a flat per-sandbox fee, if the service has one

    def __post_init__(self) -> None:
        _non_negative("managed USD per vCPU-second", self.usd_per_vcpu_second)
        _non_negative("managed USD per GiB-second", self.usd_per_gib_second)
        _non_negative("managed USD per sandbox-second", self.usd_per_sandbox_second)


@dataclass(frozen=True)
class Workload:
    """How many sandboxes run at once, for how long, and the size each is billed at."""

    sandboxes: int
    hours: float
    vcpu_per_sandbox: float = _default("vcpu_per_sandbox")
    gib_per_sandbox: float = _default("gib_per_sandbox")

    def __post_init__(self) -> None:
        _require(
            isinstance(self.sandboxes, int)
            and not isinstance(self.sandboxes, bool)
            and self.sandboxes > 0,
            f"sandboxes must be a whole number above zero, not {self.sandboxes!r}",
        )
        _positive("hours", self.hours)
        _positive("vCPU per sandbox", self.vcpu_per_sandbox)
        _positive("GiB per sandbox", self.gib_per_sandbox)

    @property
    def sandbox_hours(self) -> float:
        """Sandboxes * hours."""
        return self.sandboxes * self.hours


@dataclass(frozen=True)
class PerNode:
    """How many sandboxes one node holds, and why (``basis`` is one line of explanation)."""

    sandboxes: int
    method: Literal["explicit", "bench", "packing"]
    basis: str

    def __post_init__(self) -> None:
        _require(
            isinstance(self.sandboxes, int)
            and not isinstance(self.sandboxes, bool)
            and self.sandboxes >= 1,
            f"sandboxes per node must be a whole number of at least 1, not {self.sandboxes!r}",
        )


def per_node_explicit(sandboxes: int) -> PerNode:
    """Sandboxes per node as given by the user."""
    return PerNode(sandboxes, "explicit", f"given: {sandboxes} per node")


def per_node_by_packing(workload: Workload, node: NodeShape) -> PerNode:
    """Sandboxes per node when each gets its full allocated size, no overcommit.

    ``floor(min(node vCPUs / vCPU per sandbox, node GiB / GiB per sandbox))``: the density a
    managed service's billing assumes, so both sides price the same allocation.
    """
    by_cpu = math.floor(node.vcpus / workload.vcpu_per_sandbox + _EPSILON)
    by_memory = math.floor(node.memory_gib / workload.gib_per_sandbox + _EPSILON)
    fit = min(by_cpu, by_memory)
    _require(
        fit >= 1,
        f"a {workload.vcpu_per_sandbox:g} vCPU / {workload.gib_per_sandbox:g} GiB sandbox does "
        f"not fit a {node.vcpus:g} vCPU / {node.memory_gib:g} GiB node",
    )
    return PerNode(
        fit,
        "packing",
        f"packed by allocated size: min({node.vcpus:g} vCPU / {workload.vcpu_per_sandbox:g}, "
        f"{node.memory_gib:g} GiB / {workload.gib_per_sandbox:g}) = {fit}",
    )


@dataclass(frozen=True)
class BenchResult:
    """The fields of a ``bench concurrency --json`` result this calculator uses."""

    sandboxes: int
    success_rate: float
    commands_per_s: float
    wall_s: float
    orchestrator_peak_rss_bytes: int
    per_sandbox_rss_bytes: int
    machine_cpu_count: int
    machine_memory_total_bytes: int


def _field(data: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in data:
        raise CostInputError(f"{where}: missing field {key!r}")
    value = data[key]
    ok = not isinstance(value, bool) and (
        isinstance(value, int) if kind is int else isinstance(value, int | float)
    )
    if not ok or not math.isfinite(value):
        wanted = "a whole number" if kind is int else "a number"
        raise CostInputError(f"{where}: field {key!r} must be {wanted}, not {value!r}")
    return value


def _larger_memory_figure(data: dict[str, Any]) -> str:
    """Of a bench result's two per-sandbox memory figures, the key of the larger: the
    machine's used memory counts everything but can drown a few sandboxes in other
    processes' churn; the server tree's PSS cannot, but misses kernel memory."""
    keys = ("per_sandbox_memory_bytes", "per_sandbox_pss_bytes")
    numbers = {k: data[k] for k in keys if type(data.get(k)) is int}
    if not numbers:
        return keys[0]
    return max(numbers, key=lambda k: numbers[k])


def parse_bench(data: Any, where: str = "bench result") -> BenchResult:
    """One result object as written by ``bench concurrency --json``; raises CostInputError.

    ``per_sandbox_rss_bytes`` may be given as ``per_sandbox_memory_bytes`` (the machine's
    used memory per sandbox) and ``per_sandbox_pss_bytes`` (the server tree's PSS per
    sandbox), of which the larger counts; ``orchestrator_peak_rss_bytes`` may be missing or null (a bench run
    against an existing ``--url`` cannot see the orchestrator), in which case it counts as 0.
    """
    if not isinstance(data, dict):
        raise CostInputError(f"{where}: expected a JSON object, got {type(data).__name__}")
    machine = data.get("machine")
    if not isinstance(machine, dict):
        raise CostInputError(f"{where}: missing object 'machine'")
    per_sandbox = "per_sandbox_rss_bytes"
    if per_sandbox not in data:
        per_sandbox = _larger_memory_figure(data)
    orchestrator = "orchestrator_peak_rss_bytes"
    result = BenchResult(
        sandboxes=_field(data, "sandboxes", int, where),
        success_rate=_field(data, "success_rate", float, where),
        commands_per_s=_field(data, "commands_per_s", float, where),
        wall_s=_field(data, "wall_s", float, where),
        orchestrator_peak_rss_bytes=_field(data, orchestrator, int, where)
        if data.get(orchestrator) is not None
        else 0,
        per_sandbox_rss_bytes=_field(data, per_sandbox, int, where),
        machine_cpu_count=_field(machine, "cpu_count", int, f"{where}: machine"),
        machine_memory_total_bytes=_field(machine, "memory_total_bytes", int, f"{where}: machine"),
    )
    _require(result.sandboxes >= 1, f"{where}: 'sandboxes' must be at least 1")
    _require(0 <= result.success_rate <= 1, f"{where}: 'success_rate' must be within 0..1")
    _require(
        result.per_sandbox_rss_bytes > 0,
        f"{where}: {per_sandbox!r} must be above 0 (no memory per sandbox was measured; "
        "pass --sandboxes-per-node instead)",
    )
    _require(result.orchestrator_peak_rss_bytes >= 0, f"{where}: negative {orchestrator!r}")
    _require(result.machine_cpu_count > 0, f"{where}: 'machine.cpu_count' must be above 0")
    _require(
        result.machine_memory_total_bytes > 0,
        f"{where}: 'machine.memory_total_bytes' must be above 0",
    )
    return result


def load_bench(path: Path) -> BenchResult:
    """Read a ``bench concurrency --json`` file and pick the level it proved.

    The file holds one result object, or a list of them (several concurrency levels); the
    result kept is the largest ``sandboxes`` whose ``success_rate`` is exactly 1.0. Raises
    CostInputError when the file is missing, is not JSON, lacks a field, or proves nothing.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise CostInputError(f"bench result {path}: no such file") from None
    except OSError as exc:
        raise CostInputError(f"bench result {path}: cannot read it ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CostInputError(
            f"bench result {path}: not JSON ({exc.msg}, line {exc.lineno})"
        ) from None
    entries = data if isinstance(data, list) else [data]
    results = [parse_bench(entry, f"bench result {path}") for entry in entries]
    proven = [result for result in results if result.success_rate == 1.0]
    if not proven:
        rates = ", ".join(f"{r.sandboxes} at {r.success_rate:.1%}" for r in results) or "none"
        raise CostInputError(
            f"bench result {path}: no concurrency level finished with 100% success ({rates}); "
            "rerun `orchard-env bench concurrency` with fewer sandboxes"
        )
    return max(proven, key=lambda result: result.sandboxes)


def per_node_from_bench(bench: BenchResult, node: NodeShape) -> PerNode:
    """Sandboxes per node of ``node`` from a bench run proven at 100% success.

    The rule, conservative on purpose:

    1. ``proven``: the bench's ``sandboxes``, scaled DOWN (never up) by the node's size next
       to the bench machine's: ``floor(sandboxes * min(1, node memory / machine memory,
       node vCPUs / machine CPUs))``. A node smaller than the bench machine is not assumed to
       hold what the machine held; a larger one is not credited with concurrency nobody ran.
    2. ``memory fit``: how many sandboxes' measured RSS fit the node's memory once the
       orchestrator's peak RSS is set aside: ``floor((node memory - orchestrator peak RSS) /
       per-sandbox RSS)``.
    3. sandboxes per node = ``min(proven, memory fit)``; below 1 is an error.

    To claim more density on a big node, run the bench at a higher concurrency (on a machine
    like the node) or pass ``--sandboxes-per-node``.
    """
    node_bytes = node.memory_gib * GIB
    scale = min(
        1.0, node_bytes / bench.machine_memory_total_bytes, node.vcpus / bench.machine_cpu_count
    )
    proven = math.floor(bench.sandboxes * scale + _EPSILON)
    memory_fit = math.floor(
        (node_bytes - bench.orchestrator_peak_rss_bytes) / bench.per_sandbox_rss_bytes + _EPSILON
    )
    fit = min(proven, memory_fit)
    _require(
        fit >= 1,
        f"the bench result gives less than one sandbox per {node.memory_gib:g} GiB / "
        f"{node.vcpus:g} vCPU node (proven {proven}, memory fit {memory_fit})",
    )
    basis = (
        f"bench: {bench.sandboxes} sandboxes at 100% success on {bench.machine_cpu_count} CPU / "
        f"{bench.machine_memory_total_bytes / GIB:.1f} GiB, scaled x{scale:.2f} → {proven}; "
        f"memory fit at {bench.per_sandbox_rss_bytes / 2**20:.1f} MiB each "
        f"(+{bench.orchestrator_peak_rss_bytes / 2**20:.0f} MiB orchestrator) → {memory_fit}; "
        f"min = {fit}"
    )
    return PerNode(fit, "bench", basis)


@dataclass(frozen=True)
class CostReport:
    """The answer: nodes, totals, ratios and costs per sandbox-hour.

    Ratios are managed ÷ self-hosted (how many times the managed bill is larger); ``None``
    when the self-hosted side costs nothing.
    """

    workload: Workload
    node: NodeShape
    managed: ManagedPrice
    per_node: PerNode
    nodes: int
    node_hours: float
    self_hosted_on_demand_usd: float
    self_hosted_spot_usd: float
    managed_vcpu_seconds: float
    managed_gib_seconds: float
    managed_usd: float
    managed_to_on_demand: float | None
    managed_to_spot: float | None
    on_demand_usd_per_sandbox_hour: float
    spot_usd_per_sandbox_hour: float
    managed_usd_per_sandbox_hour: float
    sources: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (inputs, results and where each input came from)."""
        return asdict(self)


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def estimate(
    workload: Workload,
    node: NodeShape | None = None,
    managed: ManagedPrice | None = None,
    per_node: PerNode | None = None,
    sources: dict[str, dict[str, str]] | None = None,
) -> CostReport:
    """Price ``workload`` self-hosted on ``node`` (on-demand and spot) and on ``managed``.

    ``per_node`` defaults to :func:`per_node_by_packing`. ``sources`` (input name → where
    its value came from) is carried into the report unchanged.
    """
    node = node or NodeShape()
    managed = managed or ManagedPrice()
    per_node = per_node or per_node_by_packing(workload, node)
    nodes = -(-workload.sandboxes // per_node.sandboxes)  # ceil, in integers
    node_hours = nodes * workload.hours
    on_demand = node_hours * node.on_demand_usd_per_hour
    spot = node_hours * node.spot_usd_per_hour
    sandbox_seconds = workload.sandbox_hours * SECONDS_PER_HOUR
    vcpu_seconds = sandbox_seconds * workload.vcpu_per_sandbox
    gib_seconds = sandbox_seconds * workload.gib_per_sandbox
    managed_usd = (
        vcpu_seconds * managed.usd_per_vcpu_second
        + gib_seconds * managed.usd_per_gib_second
        + sandbox_seconds * managed.usd_per_sandbox_second
    )
    sandbox_hours = workload.sandbox_hours
    return CostReport(
        workload=workload,
        node=node,
        managed=managed,
        per_node=per_node,
        nodes=nodes,
        node_hours=node_hours,
        self_hosted_on_demand_usd=on_demand,
        self_hosted_spot_usd=spot,
        managed_vcpu_seconds=vcpu_seconds,
        managed_gib_seconds=gib_seconds,
        managed_usd=managed_usd,
        managed_to_on_demand=_ratio(managed_usd, on_demand),
        managed_to_spot=_ratio(managed_usd, spot),
        on_demand_usd_per_sandbox_hour=on_demand / sandbox_hours,
        spot_usd_per_sandbox_hour=spot / sandbox_hours,
        managed_usd_per_sandbox_hour=managed_usd / sandbox_hours,
        sources=dict(sources or {}),
    )


# --- command line -------------------------------------------------------------------------

#: flag dest → (DEFAULT_SOURCES key, help)
_PRICED_FLAGS: dict[str, tuple[str, str]] = {
    "vcpu_per_sandbox": ("vcpu_per_sandbox", "vCPUs each sandbox is billed for"),
    "gib_per_sandbox": ("gib_per_sandbox", "GiB each sandbox is billed for"),
    "node_vcpus": ("node_vcpus", "vCPUs of one self-hosted node"),
    "node_memory_gib": ("node_memory_gib", "GiB of one self-hosted node"),
    "on_demand_usd_per_hour": ("on_demand_usd_per_hour", "on-demand price of one node"),
    "spot_usd_per_hour": ("spot_usd_per_hour", "spot price of one node"),
    "managed_usd_per_vcpu_second": ("managed_usd_per_vcpu_second", "managed vCPU price"),
    "managed_usd_per_gib_second": ("managed_usd_per_gib_second", "managed memory price"),
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``cost`` subcommand to a command line's subparsers (``orchard-env-bench``'s,
    which ``orchard-env cost`` runs too)."""
    parser = subparsers.add_parser(
        "cost",
        help="self-hosted vs managed sandbox cost",
        description="Price sandboxes x hours on self-hosted nodes (on-demand and spot) next to "
        "a managed per-second service. Defaults and their sources: docs/cost.md.",
    )
    parser.add_argument("--sandboxes", type=int, required=True, help="sandboxes running at once")
    parser.add_argument("--hours", type=float, required=True, help="how long they run")
    for dest, (key, text) in _PRICED_FLAGS.items():
        default = DEFAULT_SOURCES[key]
        parser.add_argument(
            "--" + dest.replace("_", "-"),
            type=float,
            default=None,
            help=f"{text} (default {default.value:g} {default.unit}, {default.status})",
        )
    parser.add_argument(
        "--managed-usd-per-sandbox-second",
        type=float,
        default=0.0,
        help="a flat managed fee per sandbox-second, if any (default 0)",
    )
    parser.add_argument("--node-name", default=None, help=f"default: {DEFAULT_NODE_NAME}")
    parser.add_argument("--managed-name", default=None, help=f"default: {DEFAULT_MANAGED_NAME}")
    density = parser.add_mutually_exclusive_group()
    density.add_argument(
        "--sandboxes-per-node",
        type=int,
        default=None,
        help="sandboxes one node holds (default: packed by the allocated size)",
    )
    density.add_argument(
        "--from-bench",
        type=Path,
        default=None,
        metavar="FILE",
        help="derive sandboxes per node from a `bench concurrency --json` result",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _describe(source: PriceSource) -> dict[str, str]:
    return {
        "status": source.status,
        "as_of": source.as_of,
        "source": source.source,
        "note": source.note,
    }


def report_from_args(args: argparse.Namespace) -> CostReport:
    """Build the report the ``cost`` subcommand prints; raises CostInputError."""
    values: dict[str, float] = {}
    sources: dict[str, dict[str, str]] = {}
    for dest, (key, _) in _PRICED_FLAGS.items():
        given = getattr(args, dest)
        if given is None:
            values[dest] = DEFAULT_SOURCES[key].value
            sources[dest] = _describe(DEFAULT_SOURCES[key])
        else:
            values[dest] = given
            sources[dest] = {"status": "given", "source": "the command line"}
    workload = Workload(
        args.sandboxes, args.hours, values["vcpu_per_sandbox"], values["gib_per_sandbox"]
    )
    node_default = all(getattr(args, dest) is None for dest in _NODE_FLAGS)
    node = NodeShape(
        values["node_vcpus"],
        values["node_memory_gib"],
        values["on_demand_usd_per_hour"],
        values["spot_usd_per_hour"],
        args.node_name or (DEFAULT_NODE_NAME if node_default else "custom node"),
    )
    managed_default = all(getattr(args, dest) is None for dest in _MANAGED_FLAGS)
    managed = ManagedPrice(
        values["managed_usd_per_vcpu_second"],
        values["managed_usd_per_gib_second"],
        args.managed_name or (DEFAULT_MANAGED_NAME if managed_default else "custom managed"),
        args.managed_usd_per_sandbox_second,
    )
    if args.sandboxes_per_node is not None:
        per_node = per_node_explicit(args.sandboxes_per_node)
    elif args.from_bench is not None:
        per_node = per_node_from_bench(load_bench(args.from_bench), node)
        sources["sandboxes_per_node"] = {"status": "measured", "source": str(args.from_bench)}
    else:
        per_node = per_node_by_packing(workload, node)
    return estimate(workload, node, managed, per_node, sources)


_NODE_FLAGS = ("node_vcpus", "node_memory_gib", "on_demand_usd_per_hour", "spot_usd_per_hour")
_MANAGED_FLAGS = ("managed_usd_per_vcpu_second", "managed_usd_per_gib_second")


def _usd(value: float) -> str:
    return f"${value:,.2f}" if value >= 1 else f"${value:.4f}"


def _times(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def print_report(report: CostReport, console: Any = None) -> None:
    """Render ``report`` as rich tables (on stdout unless a ``rich`` console is given)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    work = report.workload
    table = Table(
        title=f"{work.sandboxes} sandboxes x {work.hours:g} h, "
        f"{work.vcpu_per_sandbox:g} vCPU / {work.gib_per_sandbox:g} GiB each",
        caption=f"self-hosted: {report.node.name}, {report.node.vcpus:g} vCPU / "
        f"{report.node.memory_gib:g} GiB, {report.per_node.sandboxes} sandboxes per node; "
        f"managed: {report.managed.name}",
    )
    table.add_column("option")
    table.add_column("nodes", justify="right")
    table.add_column("total", justify="right")
    table.add_column("per sandbox-hour", justify="right")
    table.add_column("managed ÷ this", justify="right")
    nodes = str(report.nodes)
    table.add_row(
        "self-hosted, on-demand",
        nodes,
        _usd(report.self_hosted_on_demand_usd),
        _usd(report.on_demand_usd_per_sandbox_hour),
        _times(report.managed_to_on_demand),
    )
    table.add_row(
        "self-hosted, spot",
        nodes,
        _usd(report.self_hosted_spot_usd),
        _usd(report.spot_usd_per_sandbox_hour),
        _times(report.managed_to_spot),
    )
    table.add_row(
        "managed",
        "-",
        _usd(report.managed_usd),
        _usd(report.managed_usd_per_sandbox_hour),
        "1.00x",
    )
    console.print(table)
    console.print(f"sandboxes per node: {report.per_node.basis}")
    inputs = Table(title="inputs")
    inputs.add_column("input", no_wrap=True)
    inputs.add_column("value", justify="right", no_wrap=True)
    inputs.add_column("status")
    inputs.add_column("source (notes: --json, docs/cost.md)", overflow="fold")
    for dest in _PRICED_FLAGS:
        source = report.sources.get(dest, {})
        inputs.add_row(
            dest,
            f"{_input_value(report, dest):g}",
            " ".join(filter(None, [source.get("status"), source.get("as_of")])),
            source.get("source", ""),
        )
    console.print(inputs)


def _input_value(report: CostReport, dest: str) -> float:
    mapping: dict[str, float] = {
        "vcpu_per_sandbox": report.workload.vcpu_per_sandbox,
        "gib_per_sandbox": report.workload.gib_per_sandbox,
        "node_vcpus": report.node.vcpus,
        "node_memory_gib": report.node.memory_gib,
        "on_demand_usd_per_hour": report.node.on_demand_usd_per_hour,
        "spot_usd_per_hour": report.node.spot_usd_per_hour,
        "managed_usd_per_vcpu_second": report.managed.usd_per_vcpu_second,
        "managed_usd_per_gib_second": report.managed.usd_per_gib_second,
    }
    return mapping[dest]


def run(args: argparse.Namespace, prog: str = "orchard-env cost") -> int:
    """Run the ``cost`` subcommand: 0 on success, 2 (``prog: error: ...`` on stderr) on bad
    input."""
    import sys

    try:
        report = report_from_args(args)
    except CostInputError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print_report(report)
    return 0

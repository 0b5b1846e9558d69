"""``orchard-env-bench``: the benches and the cost model on the command line.

The arguments are defined here once. ``orchard-env bench ARGS`` and ``orchard-env cost
ARGS`` (the server's command line) hand their arguments to :func:`main` unparsed, with
their own ``prog`` so that help and errors name the command that was typed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchard_env_server.backends import BACKENDS

from . import cost


def _bench_options(parser: argparse.ArgumentParser, runs: int | None) -> None:
    parser.add_argument("--url", default=None, help="an existing server (default: start one)")
    parser.add_argument("--backend", default="local", choices=BACKENDS)
    parser.add_argument(
        "--image", default=None, help="default: host (local), orchard-test/debian (others)"
    )
    if runs is not None:
        parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--plot", type=Path, default=None, metavar="PNG", help="save a chart")


def add_bench_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Add the benches (``latency``, ``create``, ``bridge``, ``concurrency``) to a command
    line's subparsers; :func:`run` runs what they parse."""
    latency = subparsers.add_parser("latency", help="exec round trip and file throughput")
    _bench_options(latency, runs=200)
    latency.add_argument("--command", dest="cmd", default="true")
    latency.add_argument(
        "--file-runs", type=int, default=3, help="uploads/downloads per size (0: skip files)"
    )
    create = subparsers.add_parser(
        "create", help="create → ready next to a bare bwrap (local) or docker run (Docker)"
    )
    _bench_options(create, runs=20)
    create.add_argument(
        "--concurrent",
        type=int,
        default=None,
        metavar="N",
        help="also N creates at once next to a loop of N docker run -d (Docker)",
    )
    create.add_argument(
        "--warm-pool",
        type=int,
        default=None,
        metavar="N",
        help="also creates served from a warm pool of N (local; a server with --warm-pool)",
    )
    _bench_options(
        subparsers.add_parser("bridge", help="a service bridge's round trip next to a direct call"),
        runs=200,
    )
    concurrency = subparsers.add_parser(
        "concurrency", help="N sandboxes at once, M commands in each, then delete all"
    )
    _bench_options(concurrency, runs=None)
    concurrency.add_argument("--sandboxes", type=int, default=100)
    concurrency.add_argument("--commands", type=int, default=10, help="per sandbox")
    concurrency.add_argument(
        "--connections",
        type=int,
        default=16,
        help="connections per client; one client per this many sandboxes (default 16)",
    )
    concurrency.add_argument(
        "--parallel",
        type=int,
        default=None,
        help="commands in flight across all sandboxes (default: one per sandbox)",
    )


def build_parser(
    prog: str = "orchard-env-bench", *, with_cost: bool = True
) -> argparse.ArgumentParser:
    """The command line: one subcommand per bench, and ``cost`` unless ``with_cost`` is
    false (``orchard-env bench`` has no ``cost``: that is ``orchard-env cost``)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Measure an Orchard Env service next to direct baselines"
        + (", and price a sandbox fleet" if with_cost else ""),
    )
    sub = parser.add_subparsers(dest="bench", required=True)
    add_bench_parsers(sub)
    if with_cost:
        cost.add_parser(sub)
    return parser


Runner = Callable[[argparse.Namespace], dict[str, Any]]
Printer = Callable[[dict[str, Any]], None]
Plotter = Callable[[dict[str, Any], Path], None]


def _bench_functions(name: str) -> tuple[Runner, Printer, Plotter]:
    """The bench called ``name``: what runs it from parsed arguments, prints and plots it.
    Imported here, not at the top: ``cost`` needs neither the client nor psutil."""
    if name == "create":
        from . import create

        return (
            lambda a: create.bench_create(
                a.url, a.backend, a.runs, a.image, concurrent=a.concurrent, warm_pool=a.warm_pool
            ),
            create.print_create,
            create.plot_create,
        )
    if name == "bridge":
        from . import bridge

        return (
            lambda a: bridge.bench_bridge(a.url, a.backend, a.runs, a.image),
            bridge.print_bridge,
            bridge.plot_bridge,
        )
    if name == "concurrency":
        from . import concurrency

        def run_concurrency(a: argparse.Namespace) -> dict[str, Any]:
            return concurrency.bench_concurrency(
                a.url,
                a.backend,
                a.sandboxes,
                a.commands,
                a.image,
                connections=a.connections,
                quiet=a.json,
                parallel=a.parallel,
            )

        return run_concurrency, concurrency.print_concurrency, concurrency.plot_concurrency
    from . import latency

    return (
        lambda a: latency.bench_latency(
            a.url, a.backend, a.runs, a.cmd, a.image, file_runs=a.file_runs
        ),
        latency.print_latency,
        latency.plot_latency,
    )


def run_bench(args: argparse.Namespace, prog: str = "orchard-env-bench") -> int:
    """Run the bench ``args`` name and show its result: 0, or 1 when ``concurrency`` saw a
    sandbox fail. Exits with a message naming ``prog`` on a count below 1."""
    for name in (
        "runs",
        "sandboxes",
        "commands",
        "connections",
        "file_runs",
        "parallel",
        "concurrent",
    ):
        value = getattr(args, name, None)
        if value is not None and value < (0 if name == "file_runs" else 1):
            raise SystemExit(f"{prog}: --{name.replace('_', '-')} must be positive")
    bench, show, plot = _bench_functions(args.bench)
    results = bench(args)
    if args.plot is not None:
        plot(results, args.plot)
    public = {k: v for k, v in results.items() if not k.startswith("_")}
    if args.json:
        print(json.dumps(public, indent=2))
    else:
        show(public)
        if args.plot is not None:
            print(f"plot saved to {args.plot}")
    if args.bench == "concurrency" and public["success_rate"] < 1.0:
        return 1
    return 0


def run(args: argparse.Namespace, prog: str = "orchard-env-bench") -> int:
    """Run what :func:`build_parser` (with the same ``prog``) parsed: a bench or ``cost``."""
    if args.bench == "cost":
        return cost.run(args, prog=f"{prog} cost")
    return run_bench(args, prog=f"{prog} {args.bench}")


def main(
    argv: Sequence[str] | None = None, *, prog: str = "orchard-env-bench", with_cost: bool = True
) -> int:
    """``orchard-env-bench``; also ``orchard-env bench`` (``prog="orchard-env bench"``,
    ``with_cost=False``) and ``orchard-env cost`` (``prog="orchard-env"``, ``argv`` starting
    with ``cost``)."""
    args = build_parser(prog, with_cost=with_cost).parse_args(argv)
    return run(args, prog)


if __name__ == "__main__":
    sys.exit(main())

"""``orchard-swe bar-sim`` (simulate BAR against its baselines) and ``orchard-swe bar replay``
(BAR's decisions for recorded prompts)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import attrs
from rich.console import Console
from rich.markup import escape

from ..algorithms.bar_replay import ReplayInputError, replay_stream
from ..algorithms.barsim import METHODS, SimConfig, plot_results, results_table, run_sim
from .common import Command

__all__ = ["REPLAY", "SIM", "config_from_args"]


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """One option per :class:`SimConfig` field (``--n-max`` for ``n_max``), and the outputs."""
    for field in attrs.fields(SimConfig):
        default = field.default
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            type=type(default),
            default=default,
            help=f"(default: {default})",
        )
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--plot", type=Path, default=None, help="save a PNG chart here")


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The :class:`SimConfig` the parsed arguments describe (``ValueError`` if invalid)."""
    return SimConfig(**{f.name: getattr(args, f.name) for f in attrs.fields(SimConfig)})


def run_sim_command(args: argparse.Namespace, console: Console) -> int:
    """Simulate, then print a table (or JSON) to stdout and optionally save the plot."""
    cfg = config_from_args(args)
    results = run_sim(cfg, tuple(args.methods))
    if args.json:
        print(
            json.dumps(
                {"config": attrs.asdict(cfg), "results": [r.to_dict() for r in results]}, indent=2
            )
        )
    else:
        out = Console()
        if not out.is_terminal:
            out = Console(width=120)
        out.print(results_table(results))
    if args.plot is not None:
        title = (
            f"bar-sim: pass rate ~ Beta({cfg.alpha}, {cfg.beta}), n={cfg.n}, "
            f"n_max={cfg.n_max}, {cfg.steps} steps x {cfg.batch} prompts, seed {cfg.seed}"
        )
        try:
            plot_results(results, args.plot, title)
        except RuntimeError as exc:
            console.print(f"[red]error:[/red] {escape(str(exc))}")
            return 2
        console.print(f"plot saved to {args.plot}")
    return 0


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """``orchard-swe bar replay`` and its ``--profile``."""
    sub = parser.add_subparsers(dest="bar_command", required=True)
    replay = sub.add_parser(
        "replay", help="JSON Lines prompts on stdin -> one decision per line on stdout"
    )
    replay.add_argument(
        "--profile",
        choices=("reference", "orchard"),
        default="reference",
        help="whose rules: the public reference's (default) or our own allocator's",
    )


def run_replay(args: argparse.Namespace, console: Console) -> int:
    """Replay stdin to stdout (:func:`~orchard_swe.algorithms.bar_replay.replay_stream`);
    2 on a bad prompt line."""
    try:
        replay_stream(sys.stdin, sys.stdout, args.profile)
    except ReplayInputError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    return 0


SIM = Command(
    "bar-sim",
    "simulate BAR vs fixed-n GRPO vs DAPO dynamic sampling",
    add_sim_arguments,
    run_sim_command,
)
REPLAY = Command(
    "bar", "BAR's decisions: replay recorded prompts", add_replay_arguments, run_replay
)

"""``orchard-swe``: grade predictions, distil trajectories, run the offline demo, simulate BAR,
build SFT data, train."""

from __future__ import annotations

import argparse
from typing import Final

from rich.console import Console

from ..tasks import TaskLoadError
from . import bar, credit, demo, distill, grade, grpo, sft, value
from .common import Command

__all__ = ["COMMANDS", "Command", "main"]

COMMANDS: Final[tuple[Command, ...]] = (
    grade.COMMAND,
    distill.COMMAND,
    demo.COMMAND,
    bar.SIM,
    bar.REPLAY,
    credit.COMMAND,
    grpo.COMMAND,
    sft.TRAIN,
    sft.PROOF_DATA,
    value.COMMAND,
    sft.DATA,
)
"""Every subcommand, in the order ``--help`` lists them; each module of this package
defines its own (options and run together)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchard-swe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_arguments(sub.add_parser(command.name, help=command.help))
    return parser


def main(argv: list[str] | None = None) -> int:
    """``orchard-swe``: run one subcommand; 2 on bad input (the error printed), else its code."""
    args = _parser().parse_args(argv)
    console = Console(stderr=True)
    run = {command.name: command.run for command in COMMANDS}[args.command]
    try:
        return run(args, console)
    except (TaskLoadError, FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2

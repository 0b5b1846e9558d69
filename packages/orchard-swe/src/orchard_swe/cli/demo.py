"""``orchard-swe demo``: both harnesses, scripted models, the built-in tasks, offline."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from .common import Command, service_arguments

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``orchard-swe demo``."""
    parser.add_argument("--out", type=Path, default=Path("orchard-swe-demo"))
    parser.add_argument("--concurrency", type=int, default=4)
    service_arguments(parser)


def run(args: argparse.Namespace, console: Console) -> int:
    """Run :func:`orchard_swe.demo.run_demo`; 0 when every result is as expected."""
    from ..demo import run_demo

    return run_demo(args.url, args.api_key, args.out, args.concurrency, args.image, console)


COMMAND = Command(
    "demo", "offline: both harnesses, scripted model, built-in tasks", add_arguments, run
)

"""What the ``orchard-swe`` commands share: the command record and the service options."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs
from rich.console import Console

__all__ = ["DEFAULT_URL", "Command", "run_trainer", "service_arguments"]

DEFAULT_URL: Final = "http://127.0.0.1:8000"
"""The Orchard Env service when neither an option nor ``$ORCHARD_ENV_URL`` names one."""


@attrs.frozen
class Command:
    """One ``orchard-swe`` subcommand: its name, one-line help, options and run."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    """Adds the command's options to its subparser."""
    run: Callable[[argparse.Namespace, Console], int]
    """Runs it on the parsed options (messages to the console); the exit code."""


def service_arguments(parser: argparse.ArgumentParser) -> None:
    """``--url``, ``--api-key`` and ``--image``: the Orchard Env service and sandbox image."""
    parser.add_argument(
        "--url",
        default=os.environ.get("ORCHARD_ENV_URL", DEFAULT_URL),
        help="the Orchard Env service (default: $ORCHARD_ENV_URL or :8000)",
    )
    parser.add_argument("--api-key", default=os.environ.get("ORCHARD_ENV_API_KEY"))
    parser.add_argument(
        "--image",
        default=None,
        help="sandbox image for repository tasks (default: host / orchard-test/debian)",
    )


def run_trainer(
    train: Callable[[], dict[str, Any]], keys: Sequence[str], head: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Run a trainer (its progress goes to stderr) and print a one-line JSON summary: ``head``
    and the report's ``keys``. The report, or None when training failed (the error printed
    on stderr)."""
    from ..trainers.llm_venv import LLMVenvError
    from ..trainers.worker import WorkerError

    try:
        report = train()
    except (WorkerError, LLMVenvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    print(json.dumps({**head, **{k: report[k] for k in keys}}))
    return report

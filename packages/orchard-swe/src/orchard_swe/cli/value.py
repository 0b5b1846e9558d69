"""``orchard-swe train-value``: train a value model V(prefix) on graded trajectories."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final

from rich.console import Console

from ..trainers.value_model import train_value_model
from ..trainers.worker import MODELS
from .common import Command, run_trainer

__all__ = ["COMMAND", "SUMMARY"]

SUMMARY: Final = (
    "model",
    "params",
    "steps",
    "examples",
    "prefixes",
    "loss_before",
    "loss_after",
    "before",
    "after",
    "train_seconds",
    "seconds",
)
"""The report's fields ``train-value`` prints."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``orchard-swe train-value``."""
    parser.add_argument(
        "--trajectories",
        type=Path,
        required=True,
        help="trajectory JSONL, or a directory of them (graded)",
    )
    parser.add_argument("--out", type=Path, required=True, help="the model directory")
    parser.add_argument("--base", choices=MODELS, default="random-tiny")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=8, help="trajectories per step")
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help="default: 1e-2 with a frozen backbone, else 3e-3 random-tiny, 1e-5 smollm2",
    )
    parser.add_argument(
        "--freeze-backbone",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="train the head only (default: yes for smollm2)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace, console: Console) -> int:
    """``orchard-swe train-value``: progress on stderr, a JSON summary on stdout."""
    report = run_trainer(
        lambda: train_value_model(
            args.trajectories,
            args.out,
            base=args.base,
            steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            freeze_backbone=args.freeze_backbone,
            threads=args.threads,
            seed=args.seed,
        ),
        SUMMARY,
        {"model_dir": str(args.out)},
    )
    return 0 if report is not None else 1


COMMAND = Command("train-value", "train a value model V(prefix)", add_arguments, run)

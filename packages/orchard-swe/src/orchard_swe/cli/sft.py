"""``orchard-swe sft-data`` (trajectories and credit samples → tokenized SFT data),
``sft-proof-data`` (the CPU training proof's data) and ``train-sft`` (a few SFT steps on CPU)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Final

from rich.console import Console

from ..data.sft_data import SftConfig, build_sft_data, read_samples, write_records
from ..data.tokenizer import SMOLLM2, load_tokenizer
from ..trainers.sft_train import PROOF_HARNESSES, make_proof_data, train_sft
from ..trainers.worker import MODELS
from .common import Command, run_trainer, service_arguments

__all__ = ["DATA", "PROOF_DATA", "TRAIN", "TRAIN_SUMMARY"]

TRAIN_SUMMARY: Final = (
    "model",
    "params",
    "steps",
    "samples",
    "batch_size",
    "loss_before",
    "loss_after",
    "losses",
    "train_seconds",
    "seconds_per_step",
    "seconds",
)
"""The report's fields ``train-sft`` prints."""


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``orchard-swe sft-data``."""
    parser.add_argument(
        "--trajectories",
        type=Path,
        required=True,
        help="a JSONL file, or a directory of them (trajectories or credit samples)",
    )
    parser.add_argument(
        "--tokenizer", default="smollm2", help="'smollm2', a tokenizer directory or a .gguf file"
    )
    parser.add_argument("--out", type=Path, required=True, help="output .jsonl or .parquet")
    parser.add_argument("--format", choices=["tokens", "messages"], default="tokens")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="cut samples at a turn boundary to at most this many tokens",
    )
    parser.add_argument("--drop-long", action="store_true", help="drop over-long samples instead")
    parser.add_argument("--only-resolved", action="store_true")
    parser.add_argument(
        "--exit-status",
        action="append",
        default=None,
        help="keep only these exit statuses (repeatable)",
    )
    parser.add_argument("--no-dedupe", action="store_true")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="decode every mask and check it is exactly the assistant turns",
    )


def run_data(args: argparse.Namespace, console: Console) -> int:
    """Tokenize, write, and print the stats as JSON."""
    sft_config = SftConfig(
        max_tokens=args.max_tokens,
        drop_long=args.drop_long,
        only_resolved=args.only_resolved,
        dedupe=not args.no_dedupe,
        exit_statuses=frozenset(args.exit_status or ()) or None,
        verify=args.verify,
    )
    samples, stats = build_sft_data(
        read_samples(args.trajectories),
        load_tokenizer(args.tokenizer),
        sft_config,
        tokenizer_name=str(args.tokenizer),
    )
    write_records(samples, args.out, args.format)
    print(json.dumps({"out": str(args.out), "format": args.format, **stats.to_dict()}))
    return 0


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``orchard-swe train-sft``."""
    parser.add_argument(
        "--data",
        type=Path,
        required=True,
        help="`orchard-swe sft-data` tokens JSONL (e.g. sft-proof-data's sft.jsonl)",
    )
    parser.add_argument("--model", choices=MODELS, default="random-tiny")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps")
    parser.add_argument("--out", type=Path, required=True, help="directory for report.json")
    parser.add_argument(
        "--max-samples",
        type=int,
        default=4,
        help="the first K records are the training batch (0: all)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=0,
        help="samples per optimizer step (0: the whole training batch)",
    )
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help="learning rate (default: 3e-3 random-tiny, 2e-5 smollm2)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)


def run_train(args: argparse.Namespace, console: Console) -> int:
    """``orchard-swe train-sft``: progress on stderr, a JSON summary on stdout; 0 when the
    loss on the training batch fell, 1 when not or when training failed."""
    report = run_trainer(
        lambda: train_sft(
            args.data,
            args.out,
            model=args.model,
            steps=args.steps,
            max_samples=args.max_samples,
            batch_size=args.batch_size,
            lr=args.lr,
            threads=args.threads,
            seed=args.seed,
        ),
        TRAIN_SUMMARY,
        {"report": str(args.out / "report.json")},
    )
    return 0 if report is not None and report["loss_after"] < report["loss_before"] else 1


def add_proof_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``orchard-swe sft-proof-data``."""
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--ids", nargs="*", default=None, help="only these built-in tasks")
    parser.add_argument(
        "--harness", nargs="+", choices=PROOF_HARNESSES, default=list(PROOF_HARNESSES)
    )
    parser.add_argument("--tokenizer", default=SMOLLM2)
    parser.add_argument("--concurrency", type=int, default=4)
    service_arguments(parser)


def run_proof_data(args: argparse.Namespace, console: Console) -> int:
    """``orchard-swe sft-proof-data``: the summary as JSON on stdout."""
    summary = make_proof_data(
        args.out,
        url=args.url,
        api_key=args.api_key,
        ids=args.ids,
        harnesses=args.harness,
        tokenizer=args.tokenizer,
        concurrency=args.concurrency,
        image=args.image,
        console=console,
    )
    print(json.dumps(summary))
    return 0


DATA = Command(
    "sft-data",
    "trajectories / credit samples -> tokenized SFT data",
    add_data_arguments,
    run_data,
)
PROOF_DATA = Command(
    "sft-proof-data",
    "credit SFT data from built-in tasks",
    add_proof_data_arguments,
    run_proof_data,
)
TRAIN = Command("train-sft", "a few SFT steps on CPU with TRL", add_train_arguments, run_train)

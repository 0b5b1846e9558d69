"""``orchard-swe``: grade predictions, distil trajectories, run the offline demo, simulate BAR,
build SFT data."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchard_env_client import AsyncSandboxClient
from orchard_env_client.llm import ModelConfig

from .grading import STATUSES, GradeResult, grade
from .tasks import BUILTIN, Task, TaskLoadError, load_tasks, select_tasks
from .training.barsim_cli import add_arguments as bar_sim_arguments
from .training.credit_cli import add_arguments as credit_sft_arguments
from .training.grpo_train import add_arguments as train_grpo_arguments
from .training.sft_train import add_proof_data_arguments
from .training.sft_train import add_train_arguments as train_sft_arguments
from .training.value_model import add_arguments as train_value_arguments

DEFAULT_URL = "http://127.0.0.1:8000"


def _service_args(parser: argparse.ArgumentParser) -> None:
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


def _distill_tasks(source: str, ids: list[str] | None) -> list[Task]:
    """SWE tasks, or Terminal-Bench task directories (see ``orchard_swe.terminal_bench``)."""
    from . import terminal_bench

    if not terminal_bench.is_task_tree(source):
        return load_tasks(source, ids=ids)
    return select_tasks(terminal_bench.load_tasks(source), ids, source)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchard-swe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("grade", help="grade SWE-bench-format predictions")
    g.add_argument("--tasks", default=BUILTIN, help="task file/dataset, or 'builtin'")
    g.add_argument(
        "--predictions",
        required=True,
        type=Path,
        help="SWE-bench predictions: a JSON list/dict or JSONL of "
        "{instance_id, model_patch, model_name_or_path}",
    )
    g.add_argument("--concurrency", type=int, default=4)
    g.add_argument("--json", action="store_true", help="print a JSON list of outcomes")
    _service_args(g)

    d = sub.add_parser("distill", help="run a harness on tasks K times, grade, write JSONL")
    d.add_argument(
        "--tasks",
        default=BUILTIN,
        help="task file/dataset, 'builtin', or a Terminal-Bench task directory "
        "(or a directory of them), verified by each task's own tests",
    )
    d.add_argument("--ids", nargs="*", default=None, help="only these instance ids")
    d.add_argument("--harness", choices=["mini", "tools"], required=True)
    d.add_argument("--model", required=True)
    d.add_argument(
        "--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1")
    )
    d.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        help="environment variable holding the model endpoint's key",
    )
    d.add_argument("--concurrency", type=int, default=4)
    d.add_argument("--attempts", type=int, default=1)
    d.add_argument("--max-steps", type=int, default=30)
    d.add_argument("--max-cost", type=float, default=3.0)
    d.add_argument("--out", type=Path, required=True)
    _service_args(d)

    demo = sub.add_parser("demo", help="offline: both harnesses, scripted model, built-in tasks")
    demo.add_argument("--out", type=Path, default=Path("orchard-swe-demo"))
    demo.add_argument("--concurrency", type=int, default=4)
    _service_args(demo)

    sim = sub.add_parser("bar-sim", help="simulate BAR vs fixed-n GRPO vs DAPO dynamic sampling")
    bar_sim_arguments(sim)

    bar = sub.add_parser("bar", help="BAR's decisions: replay recorded prompts")
    bar_sub = bar.add_subparsers(dest="bar_command", required=True)
    bar_replay = bar_sub.add_parser(
        "replay", help="JSON Lines prompts on stdin -> one decision per line on stdout"
    )
    bar_replay.add_argument(
        "--profile",
        choices=("reference", "orchard"),
        default="reference",
        help="whose rules: the public reference's (default) or our own allocator's",
    )

    credit = sub.add_parser("credit-sft", help="trajectories -> credit-assignment SFT samples")
    credit_sft_arguments(credit)

    grpo = sub.add_parser("train-grpo", help="GRPO steps (TRL, CPU): BAR groups, sandbox rewards")
    train_grpo_arguments(grpo)

    train_sft = sub.add_parser("train-sft", help="a few SFT steps on CPU with TRL")
    train_sft_arguments(train_sft)

    proof = sub.add_parser("sft-proof-data", help="credit SFT data from built-in tasks")
    add_proof_data_arguments(proof)
    _service_args(proof)

    value = sub.add_parser("train-value", help="train a value model V(prefix)")
    train_value_arguments(value)

    sft = sub.add_parser("sft-data", help="trajectories / credit samples -> tokenized SFT data")
    sft.add_argument(
        "--trajectories",
        type=Path,
        required=True,
        help="a JSONL file, or a directory of them (trajectories or credit samples)",
    )
    sft.add_argument(
        "--tokenizer", default="smollm2", help="'smollm2', a tokenizer directory or a .gguf file"
    )
    sft.add_argument("--out", type=Path, required=True, help="output .jsonl or .parquet")
    sft.add_argument("--format", choices=["tokens", "messages"], default="tokens")
    sft.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="cut samples at a turn boundary to at most this many tokens",
    )
    sft.add_argument("--drop-long", action="store_true", help="drop over-long samples instead")
    sft.add_argument("--only-resolved", action="store_true")
    sft.add_argument(
        "--exit-status",
        action="append",
        default=None,
        help="keep only these exit statuses (repeatable)",
    )
    sft.add_argument("--no-dedupe", action="store_true")
    sft.add_argument(
        "--verify",
        action="store_true",
        help="decode every mask and check it is exactly the assistant turns",
    )
    return parser


def read_predictions(path: Path) -> dict[str, str]:
    """instance_id → model_patch, from SWE-bench's predictions formats."""
    text = path.read_text(encoding="utf-8")
    rows: Any
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        rows = json.loads(text)
    if isinstance(rows, dict):
        if all(isinstance(v, dict) for v in rows.values()):
            rows = [{"instance_id": k, **v} for k, v in rows.items()]
        else:
            raise ValueError(f"{path}: a dict of predictions must map ids to objects")
    out: dict[str, str] = {}
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict) or not isinstance(row.get("instance_id"), str):
            raise ValueError(f"{path}: prediction {number} has no instance_id")
        patch = row.get("model_patch")
        out[row["instance_id"]] = patch if isinstance(patch, str) else ""
    return out


async def grade_all(
    url: str,
    api_key: str | None,
    tasks: list[Task],
    predictions: dict[str, str],
    concurrency: int,
    image: str | None,
) -> list[GradeResult]:
    gate = asyncio.Semaphore(max(1, concurrency))
    async with AsyncSandboxClient(base_url=url, api_key=api_key) as client:
        backend = (await client.health()).backend

        async def one(task: Task) -> GradeResult:
            async with gate:
                return await grade(
                    client,
                    task,
                    predictions[task.instance_id],
                    backend=backend,
                    default_image=image,
                )

        return list(await asyncio.gather(*(one(t) for t in tasks)))


def print_grades(results: list[GradeResult], console: Console) -> None:
    table = Table(title="grading")
    for col in ("instance", "status", "F2P passed", "P2P passed", "note"):
        table.add_column(col)
    for r in results:
        f2p, p2p = r.fail_to_pass, r.pass_to_pass
        table.add_row(
            r.instance_id,
            r.status,
            f"{len(f2p.get('success', []))}/{len(f2p.get('success', [])) + len(f2p.get('failure', []))}",
            f"{len(p2p.get('success', []))}/{len(p2p.get('success', [])) + len(p2p.get('failure', []))}",
            (r.error or r.apply_method or "")[:60],
        )
    console.print(table)
    counts = {s: sum(1 for r in results if r.status == s) for s in STATUSES}
    console.print(", ".join(f"{s}: {n}" for s, n in counts.items() if n))


def _cmd_grade(args: argparse.Namespace, console: Console) -> int:
    predictions = read_predictions(args.predictions)
    tasks = load_tasks(args.tasks, ids=list(predictions))
    results = asyncio.run(
        grade_all(args.url, args.api_key, tasks, predictions, args.concurrency, args.image)
    )
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        print_grades(results, console)
    return 0


def _cmd_distill(args: argparse.Namespace, console: Console) -> int:
    from .distill import DistillConfig, distill

    tasks = _distill_tasks(args.tasks, args.ids)
    model = ModelConfig(model=args.model, base_url=args.base_url, api_key_env=args.api_key_env)
    config = DistillConfig(
        harness=args.harness,
        model=model,
        out_dir=args.out,
        attempts=args.attempts,
        concurrency=args.concurrency,
        max_steps=args.max_steps,
        max_cost=args.max_cost,
        default_image=args.image,
    )

    async def run() -> dict[str, Any]:
        async with AsyncSandboxClient(base_url=args.url, api_key=args.api_key) as c:
            return await distill(c, tasks, config)

    print(json.dumps(asyncio.run(run()), indent=2))
    return 0


def _cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from .demo import run_demo

    return run_demo(args.url, args.api_key, args.out, args.concurrency, args.image, console)


def _cmd_credit_sft(args: argparse.Namespace, console: Console) -> int:
    from .training.credit_cli import run as run_credit_sft

    return run_credit_sft(args, console)


def _cmd_bar(args: argparse.Namespace, console: Console) -> int:
    from .training.bar_replay import ReplayInputError, replay_stream

    try:
        replay_stream(sys.stdin, sys.stdout, args.profile)
    except ReplayInputError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    return 0


def _cmd_bar_sim(args: argparse.Namespace, console: Console) -> int:
    from .training.barsim_cli import run as run_bar_sim

    return run_bar_sim(args, console)


def _cmd_train_grpo(args: argparse.Namespace, console: Console) -> int:
    from .training.grpo_train import run as run_train_grpo

    return run_train_grpo(args, console)


def _cmd_train_sft(args: argparse.Namespace, console: Console) -> int:
    from .training.sft_train import run_train as run_train_sft

    return run_train_sft(args)


def _cmd_sft_proof_data(args: argparse.Namespace, console: Console) -> int:
    from .training.sft_train import run_proof_data

    return run_proof_data(args, console)


def _cmd_train_value(args: argparse.Namespace, console: Console) -> int:
    from .training.value_model import run as run_train_value

    return run_train_value(args)


def _cmd_sft_data(args: argparse.Namespace, console: Console) -> int:
    from .training.sft_data import SftConfig, build_sft_data, read_samples, write_records
    from .training.tokenizer import load_tokenizer

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


_COMMANDS: dict[str, Callable[[argparse.Namespace, Console], int]] = {
    "grade": _cmd_grade,
    "distill": _cmd_distill,
    "demo": _cmd_demo,
    "credit-sft": _cmd_credit_sft,
    "bar": _cmd_bar,
    "bar-sim": _cmd_bar_sim,
    "train-grpo": _cmd_train_grpo,
    "train-sft": _cmd_train_sft,
    "sft-proof-data": _cmd_sft_proof_data,
    "train-value": _cmd_train_value,
    "sft-data": _cmd_sft_data,
}


def main(argv: list[str] | None = None) -> int:
    """``orchard-swe``: run one subcommand; 2 on bad input (the error printed), else its code."""
    args = _parser().parse_args(argv)
    console = Console(stderr=True)
    try:
        return _COMMANDS[args.command](args, console)
    except (TaskLoadError, FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``orchard-swe distill``: run a harness on tasks K times, grade, write trajectory JSONL."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from rich.console import Console

from orchard_env_client import AsyncSandboxClient
from orchard_env_client.llm import ModelConfig

from ..tasks import BUILTIN, Task, load_tasks, select_tasks
from .common import Command, service_arguments

__all__ = ["COMMAND", "distill_tasks"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``orchard-swe distill``."""
    parser.add_argument(
        "--tasks",
        default=BUILTIN,
        help="task file/dataset, 'builtin', or a Terminal-Bench task directory "
        "(or a directory of them), verified by each task's own tests",
    )
    parser.add_argument("--ids", nargs="*", default=None, help="only these instance ids")
    parser.add_argument("--harness", choices=["mini", "tools"], required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument(
        "--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1")
    )
    parser.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        help="environment variable holding the model endpoint's key",
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--attempts", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--max-cost", type=float, default=3.0)
    parser.add_argument("--out", type=Path, required=True)
    service_arguments(parser)


def distill_tasks(source: str, ids: list[str] | None) -> list[Task]:
    """SWE tasks, or Terminal-Bench task directories (see ``orchard_swe.terminal_bench``)."""
    from .. import terminal_bench

    if not terminal_bench.is_task_tree(source):
        return load_tasks(source, ids=ids)
    return select_tasks(terminal_bench.load_tasks(source), ids, source)


def run(args: argparse.Namespace, console: Console) -> int:
    """Distil, then print the run's summary as JSON."""
    from ..distill import DistillConfig, distill

    tasks = distill_tasks(args.tasks, args.ids)
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

    async def distill_all() -> dict[str, Any]:
        async with AsyncSandboxClient(base_url=args.url, api_key=args.api_key) as c:
            return await distill(c, tasks, config)

    print(json.dumps(asyncio.run(distill_all()), indent=2))
    return 0


COMMAND = Command(
    "distill", "run a harness on tasks K times, grade, write JSONL", add_arguments, run
)

"""``orchard-swe grade``: grade SWE-bench-format predictions in sandboxes."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from orchard_env_client import AsyncSandboxClient

from ..grading import STATUSES, GradeResult, grade
from ..tasks import BUILTIN, Task, load_tasks
from .common import Command, service_arguments

__all__ = ["COMMAND", "grade_all", "print_grades", "read_predictions"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``orchard-swe grade``."""
    parser.add_argument("--tasks", default=BUILTIN, help="task file/dataset, or 'builtin'")
    parser.add_argument(
        "--predictions",
        required=True,
        type=Path,
        help="SWE-bench predictions: a JSON list/dict or JSONL of "
        "{instance_id, model_patch, model_name_or_path}",
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print a JSON list of outcomes")
    service_arguments(parser)


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
    """Grade every task's prediction on the service at ``url``, ``concurrency`` at a time."""
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
    """A table of the outcomes, then the count of each status."""
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


def run(args: argparse.Namespace, console: Console) -> int:
    """Grade, then print a table (or ``--json``: the outcomes as JSON)."""
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


COMMAND = Command("grade", "grade SWE-bench-format predictions", add_arguments, run)

"""``orchard-claw``: assistant tasks, cross-harness evaluation, pass@k / pass^k.

Commands: ``tasks`` (list a task spec), ``eval`` (k trials per task under one harness, a
results table), ``compare`` (the table of several finished runs side by side) and ``demo``
(the built-in tasks under our harness and the foreign ones with a scripted model).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from orchard_env_client import AsyncSandboxClient
from orchard_env_client.llm import ModelConfig
from orchard_env_client.own_service import service
from orchard_env_client.testing import ScriptedModelServer
from orchard_env_client.trajectory import read_jsonl

from .foreign import HARNESSES
from .foreign_runner import recording_proxy
from .harness import HARNESS_NAME, HarnessConfig
from .images import default_image, serve_args
from .metrics import ComparisonTable, Trial, compare
from .runner import EvalConfig, TrialDone, evaluate, trials_of
from .scripted import reference_responder
from .tasks import ClawTask, TaskError, load_tasks

_DEFAULT_URL = os.environ.get("ORCHARD_ENV_URL", "http://127.0.0.1:8000")
DEMO_HARNESSES = (HARNESS_NAME, "openclaw", "codex")


def _harness_names() -> list[str]:
    return [HARNESS_NAME, *sorted(HARNESSES)]


def _add_service(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=_DEFAULT_URL, help="Orchard Env service (default %(default)s)")
    p.add_argument("--backend", default="local", help="backend of a service started here")
    p.add_argument("--image", help="sandbox image (default: the harnesses image of the backend)")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchard-claw", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    tasks = sub.add_parser("tasks", help="list the tasks of a spec")
    tasks.add_argument("spec", nargs="?", default="builtin")

    ev = sub.add_parser("eval", help="k trials per task under one harness")
    ev.add_argument("--harness", default=HARNESS_NAME, choices=_harness_names())
    ev.add_argument("--model", required=True)
    ev.add_argument("--base-url", required=True, help="the model's OpenAI-compatible API root")
    ev.add_argument("--api-key-env", default="OPENAI_API_KEY")
    ev.add_argument(
        "--tasks", default="builtin", help="builtin, a file, or gen:<kind>:<n>[:seed=S]"
    )
    ev.add_argument("--limit", type=int, help="the first N tasks only")
    ev.add_argument("--trials", type=int, default=3, help="k: trials per task")
    ev.add_argument("--max-steps", type=int, default=30)
    ev.add_argument("--judge-model", help="an LLM judge for the tasks' rubrics (optional)")
    ev.add_argument("--judge-base-url", help="the judge's API root (default: --base-url)")
    ev.add_argument("--out", type=Path, required=True, help="run directory (resumable)")
    _add_service(ev)

    compare = sub.add_parser("compare", help="a table of finished runs side by side")
    compare.add_argument("runs", nargs="+", type=Path, help="run directories")
    compare.add_argument("--json", action="store_true")

    demo = sub.add_parser("demo", help="the built-in tasks under every harness, scripted model")
    demo.add_argument("--harnesses", default=",".join(DEMO_HARNESSES))
    demo.add_argument("--tasks", default="builtin")
    demo.add_argument("--limit", type=int, default=6, help="tasks (one kind after another)")
    demo.add_argument("--trials", type=int, default=3)
    demo.add_argument("--out", type=Path, help="run directory (default: a temporary one)")
    _add_service(demo)
    return parser


def _load(spec: str, limit: int | None = None) -> list[ClawTask]:
    tasks = load_tasks(spec)
    return tasks[:limit] if limit else tasks


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[passed]} passed"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


async def _run(
    url: str, tasks: Sequence[ClawTask], config: EvalConfig, console: Console, label: str
) -> dict[str, Any]:
    async with AsyncSandboxClient(base_url=url) as client:
        total = len(tasks) * config.trials
        with _progress(console) as progress:
            bar = progress.add_task(label, total=total, passed=0)
            passed = 0

            def done(event: TrialDone) -> None:
                nonlocal passed
                passed += 1 if (event.reward or 0) > 0 else 0
                progress.update(bar, advance=1, passed=passed)

            if config.harness == HARNESS_NAME:
                return await evaluate(client, tasks, config, on_done=done)
            with recording_proxy(config.model.base_url, config.out_dir) as proxy:
                return await evaluate(client, tasks, config, proxy=proxy, on_done=done)


def comparison_table(table: ComparisonTable) -> Table:
    """The cross-harness table as a rich table (one row per harness)."""
    out = Table(
        title=f"harnesses on the same model and tasks (k = {table.k}, "
        f"{table.confidence:.0%} bootstrap intervals over tasks)"
    )
    for column in table.columns():
        out.add_column(column, justify="left" if column == "harness" else "right")
    for cells in table.cells():
        out.add_row(*cells)
    return out


def _model(args: argparse.Namespace) -> ModelConfig:
    return ModelConfig(model=args.model, base_url=args.base_url, api_key_env=args.api_key_env)


def _judge(args: argparse.Namespace) -> ModelConfig | None:
    if not args.judge_model:
        return None
    return ModelConfig(
        model=args.judge_model,
        base_url=args.judge_base_url or args.base_url,
        api_key_env=args.api_key_env,
    )


async def _image(url: str, image: str | None, harness: str) -> str:
    if image:
        return image
    async with AsyncSandboxClient(base_url=url) as client:
        return default_image((await client.health()).backend, harness)


def _cmd_tasks(args: argparse.Namespace, console: Console) -> int:
    table = Table(title=f"tasks: {args.spec}")
    for column in ("id", "kind", "service", "instruction"):
        table.add_column(column)
    for task in _load(args.spec):
        service_port = str(task.service.port) if task.service else ""
        table.add_row(task.id, task.kind, service_port, task.instruction[:90])
    console.print(table)
    return 0


def _cmd_eval(args: argparse.Namespace, console: Console) -> int:
    tasks = _load(args.tasks, args.limit)
    with service(args.url, console.print, args.backend, serve_args(args.backend)) as url:
        config = EvalConfig(
            out_dir=args.out,
            model=_model(args),
            harness=args.harness,
            image=asyncio.run(_image(url, args.image, args.harness)),
            harness_config=HarnessConfig(max_steps=args.max_steps),
            trials=args.trials,
            concurrency=args.concurrency,
            rubric_judge=_judge(args),
        )
        asyncio.run(_run(url, tasks, config, console, args.harness))
    trials = trials_of(read_jsonl(args.out / "trajectories.jsonl"), args.harness)
    _print(compare({args.harness: trials}, args.trials), args.json)
    return 0


def _print(table: ComparisonTable, as_json: bool) -> None:
    if as_json:
        print(json.dumps(table.to_dict(), indent=2))
    else:
        Console().print(comparison_table(table))


def _cmd_compare(args: argparse.Namespace, console: Console) -> int:
    by_harness: dict[str, list[Trial]] = {}
    ks = set()
    for run in args.runs:
        results = json.loads((run / "results.json").read_text())
        harness, k = str(results["harness"]), int(results["k"])
        if harness in by_harness:
            raise TaskError(f"two runs of harness {harness!r}: compare one run per harness")
        ks.add(k)
        by_harness[harness] = trials_of(read_jsonl(run / "trajectories.jsonl"), harness)
    if len(ks) != 1:
        raise TaskError(f"the runs have different k ({sorted(ks)}): compare runs of equal k")
    _print(compare(by_harness, ks.pop()), args.json)
    return 0


@contextlib.contextmanager
def _run_dir(out: Path | None) -> Iterator[Path]:
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        yield out
        return
    with tempfile.TemporaryDirectory(prefix="orchard-claw-demo-") as tmp:
        yield Path(tmp)


def spread(tasks: Sequence[ClawTask], limit: int | None) -> list[ClawTask]:
    """Up to ``limit`` tasks taking the kinds in turn (the first of each kind, then the
    second, ...), so a short demo covers every kind."""
    by_kind: dict[str, list[ClawTask]] = {}
    for task in tasks:
        by_kind.setdefault(task.kind, []).append(task)
    order = [t for group in itertools.zip_longest(*by_kind.values()) for t in group if t]
    return order[:limit] if limit else order


def _cmd_demo(args: argparse.Namespace, console: Console) -> int:
    tasks = spread(load_tasks(args.tasks), args.limit)
    harnesses = [h.strip() for h in args.harnesses.split(",") if h.strip()]
    unknown = sorted(set(harnesses) - set(_harness_names()))
    if unknown:
        raise TaskError(f"unknown harness(es) {unknown}: choose from {_harness_names()}")
    by_harness: dict[str, list[Trial]] = {}
    errors: dict[str, int] = {}
    with (
        ScriptedModelServer() as llm,
        service(args.url, console.print, args.backend, serve_args(args.backend)) as url,
        _run_dir(args.out) as root,
    ):
        model = ModelConfig(model="scripted-reference", base_url=llm.base_url, max_retries=0)
        for harness in harnesses:
            # a fresh policy per harness: each sees its trials from the first
            llm.set_default(reference_responder(tasks, flaky=True, seed=0))
            config = EvalConfig(
                out_dir=root / harness,
                model=model,
                harness=harness,
                image=asyncio.run(_image(url, args.image, harness)),
                trials=args.trials,
                concurrency=args.concurrency,
            )
            summary = asyncio.run(_run(url, tasks, config, console, harness))
            by_harness[harness] = trials_of(
                read_jsonl(config.out_dir / "trajectories.jsonl"), harness
            )
            errors[harness] = int(summary["errors"])
            if summary["errors"]:
                console.print(f"[red]{harness}: {summary['errors']} trials ended in an error[/]")
        if args.out is not None:
            console.print(f"run directories: {root}/<harness>")
        readable = _same_reader(root, harnesses)
    table = compare(by_harness, args.trials)
    _print(table, args.json)
    ok = readable and not any(errors.values()) and all(r.pass_at_k.value == 1.0 for r in table.rows)
    console.print(
        f"[bold]{'OK' if ok else 'FAILED'}[/]: every harness solved every task in"
        f" some trial, with no errors, and every run loads with one reader"
    )
    return 0 if ok else 1


def _same_reader(root: Path, harnesses: Sequence[str]) -> bool:
    """Every harness's trajectories load with the one reader, with messages and steps."""
    for harness in harnesses:
        trajectories = read_jsonl(root / harness / "trajectories.jsonl", strict=True)
        if not trajectories or not all(t.messages for t in trajectories):
            return False
    return True


COMMANDS = {"tasks": _cmd_tasks, "eval": _cmd_eval, "compare": _cmd_compare, "demo": _cmd_demo}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``orchard-claw``."""
    args = _parser().parse_args(argv)
    console = Console(stderr=True)
    try:
        return COMMANDS[args.command](args, console)
    except (TaskError, FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``orchard-gui``: browser agents on an Orchard Env service.

Commands: ``tasks`` (list a task spec), ``eval`` (run a model on tasks), ``demo`` (the
offline tasks end to end with scripted models), ``judge`` (grade a run's trajectories
with a judge model), ``sft`` (per-step SFT data from a run), ``contact-sheets`` and
``bench`` (browser sandbox costs beside Chromium on the host).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

from .harness import HarnessConfig
from .runner import EpisodeDone, EvalConfig, evaluate
from .scripted import oracle_responder, random_responder
from .tasks import TaskError, WebTask, load_tasks

__all__ = ["main"]

_DEFAULT_URL = os.environ.get("ORCHARD_ENV_URL", "http://127.0.0.1:8000")


def _add_service(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=_DEFAULT_URL,
        help="Orchard Env service ($ORCHARD_ENV_URL; default %(default)s)",
    )
    parser.add_argument("--image", help="sandbox image (default: by the service's backend)")
    parser.add_argument("--memory", default="2Gi", help="per sandbox (default %(default)s)")
    parser.add_argument("--concurrency", type=int, default=2, help="browser sandboxes at once")


def _add_harness(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--max-time", type=float, default=300.0, help="seconds per episode")
    parser.add_argument("--history", type=int, default=3, help="screenshots in context")
    parser.add_argument("--action-format", choices=("tools", "text"), default="tools")
    parser.add_argument("--som", action="store_true", help="show the Set-of-Mark overlay image")
    parser.add_argument("--axtree", action="store_true", help="add the accessibility tree")


def _harness(args: argparse.Namespace) -> HarnessConfig:
    return HarnessConfig(
        max_steps=args.max_steps,
        max_time_s=args.max_time,
        history_screenshots=args.history,
        action_format=args.action_format,
        som_overlay=args.som,
        axtree=args.axtree,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchard-gui", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    tasks = sub.add_parser("tasks", help="list the tasks of a spec")
    tasks.add_argument("spec", help="offline | local | miniwob[:names] | a task file")
    tasks.add_argument("--json", action="store_true")

    ev = sub.add_parser("eval", help="run a model on tasks")
    ev.add_argument("--tasks", required=True, help="offline | local | miniwob[:names] | a file")
    ev.add_argument("--model", required=True)
    ev.add_argument("--base-url", required=True, help="OpenAI-compatible API root (…/v1)")
    ev.add_argument("--api-key-env", default="OPENAI_API_KEY")
    ev.add_argument("--temperature", type=float, default=0.0)
    ev.add_argument("--attempts", type=int, default=1)
    ev.add_argument("--out", type=Path, required=True, help="run directory (resumable)")
    ev.add_argument("--limit", type=int, help="only the first N tasks")
    _add_service(ev)
    _add_harness(ev)

    demo = sub.add_parser("demo", help="the offline tasks end to end with scripted models")
    demo.add_argument("--tasks", default="offline")
    demo.add_argument("--out", type=Path, help="run directory (default: a temporary one)")
    demo.add_argument("--backend", default="local", help="backend of a service started here")
    _add_service(demo)

    judge = sub.add_parser("judge", help="grade a run's trajectories with a judge model")
    judge.add_argument("run", type=Path, help="run directory (with trajectories.jsonl)")
    judge.add_argument("--model", required=True)
    judge.add_argument("--base-url", required=True)
    judge.add_argument("--api-key-env", default="OPENAI_API_KEY")
    judge.add_argument("--method", choices=("webjudge", "single"), default="webjudge")
    judge.add_argument("--concurrency", type=int, default=4)
    judge.add_argument("--out", type=Path, help="default: <run>/judged-<method>.jsonl")

    sft = sub.add_parser("sft", help="per-step SFT examples from a run")
    sft.add_argument("trajectories", type=Path, help="a trajectories JSONL file")
    sft.add_argument("--out", type=Path, required=True)
    sft.add_argument("--min-reward", type=float, default=1.0)
    sft.add_argument("--history", type=int, default=5, help="earlier actions shown as text")
    sft.add_argument("--inline-images", action="store_true", help="data: URLs, not files")

    sheets = sub.add_parser("contact-sheets", help="a PNG of each episode's screenshots")
    sheets.add_argument("run", type=Path)

    bench = sub.add_parser("bench", help="browser sandbox costs beside Chromium on the host")
    bench.add_argument("--tasks", default="offline")
    bench.add_argument("--levels", default="1,2,4", help="concurrency levels (default %(default)s)")
    bench.add_argument("--out", type=Path, help="run directories (default: a temporary one)")
    bench.add_argument("--url", default=_DEFAULT_URL)
    bench.add_argument("--backend", default="local", help="backend of a service started here")
    bench.add_argument("--image", help="sandbox image (default: by the service's backend)")
    bench.add_argument("--json", action="store_true")
    return parser


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[last]}"),
        console=console,
    )


def _results_table(title: str, summary: dict[str, Any]) -> Table:
    table = Table(title=title)
    for column in ("task", "attempt", "exit", "reward", "steps", "seconds"):
        table.add_column(column)
    for row in summary["results"]:
        reward = "-" if row["reward"] is None else f"{row['reward']:g}"
        table.add_row(
            row["task_id"],
            str(row["attempt"]),
            row["exit_status"][:40],
            reward,
            str(row["steps"]),
            f"{row['duration_s']:.1f}",
        )
    return table


async def _run(
    url: str, tasks: Sequence[WebTask], config: EvalConfig, console: Console, label: str
) -> dict[str, Any]:
    with _progress(console) as progress:
        bar = progress.add_task(label, total=len(tasks) * config.attempts, last="")

        def done(info: EpisodeDone) -> None:
            reward = "-" if info.reward is None else f"{info.reward:g}"
            last = f"{info.task_id}: {info.exit_status[:30]} reward {reward}"
            progress.update(bar, advance=1, last=last)

        async with AsyncSandboxClient(url) as client:
            return await evaluate(client, tasks, config, on_done=done)


def _print_summary(console: Console, title: str, summary: dict[str, Any]) -> None:
    console.print(_results_table(title, summary))
    rate = summary["success_rate"]
    console.print(
        f"[bold]{title}[/]: success {summary['successes']}/"
        f"{summary['rewarded'] + summary['errors']} ({'-' if rate is None else f'{rate:.0%}'}),"
        f" errors {summary['errors']}, unrewarded {summary['unrewarded']},"
        f" step latency p50 {summary['step_latency_p50_s']} s,"
        f" sandbox + browser start p50 {summary['sandbox_startup_p50_s']} s"
    )


def _load(spec: str, limit: int | None = None) -> list[WebTask]:
    tasks = load_tasks(spec)
    return tasks[:limit] if limit else tasks


def _cmd_tasks(args: argparse.Namespace, console: Console) -> int:
    tasks = _load(args.spec)
    if args.json:
        print(json.dumps([t.to_dict() for t in tasks], indent=2))
        return 0
    table = Table(title=f"{len(tasks)} tasks")
    for column in ("id", "source", "offline", "start", "instruction"):
        table.add_column(column)
    for t in tasks:
        table.add_row(t.task_id, t.source, str(t.offline), t.start_url, t.instruction[:70])
    console.print(table)
    return 0


def _cmd_eval(args: argparse.Namespace, console: Console) -> int:
    tasks = _load(args.tasks, args.limit)
    model = ModelConfig(
        model=args.model,
        base_url=args.base_url,
        api_key_env=args.api_key_env,
        temperature=args.temperature,
    )
    config = EvalConfig(
        out_dir=args.out,
        model=model,
        harness=_harness(args),
        concurrency=args.concurrency,
        attempts=args.attempts,
        image=args.image,
        memory=args.memory,
    )
    summary = asyncio.run(_run(args.url, tasks, config, console, "episodes"))
    _print_summary(console, args.model, summary)
    console.print(f"trajectories: {args.out / 'trajectories.jsonl'}")
    return 0


def _scripted_model(name: str, base_url: str) -> ModelConfig:
    """A model on the local scripted server: no API key is looked up (none is sent)."""
    return ModelConfig(model=name, base_url=base_url, api_key_env="ORCHARD_GUI_SCRIPTED_NO_KEY")


@contextlib.contextmanager
def _run_dir(given: Path | None) -> Iterator[Path]:
    if given is not None:
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="orchard-gui-demo-") as tmp:
        yield Path(tmp)


def _cmd_demo(args: argparse.Namespace, console: Console) -> int:
    tasks = [t for t in _load(args.tasks) if t.offline]
    if not tasks:
        raise TaskError(f"{args.tasks!r} has no offline tasks: the demo needs no network")
    harness = HarnessConfig(max_steps=30, max_time_s=180)
    summaries = {}
    with ScriptedModelServer() as llm, service(args.url, console.print, args.backend) as url:
        for name, responder in (
            ("oracle", oracle_responder(tasks)),
            ("random", random_responder(seed=0)),
        ):
            llm.set_default(None)
            for task in tasks:
                llm.add(task.task_id, responder)
            with _run_dir(args.out) as root:
                config = EvalConfig(
                    out_dir=root / name,
                    model=_scripted_model(f"scripted-{name}", llm.base_url),
                    harness=harness,
                    concurrency=args.concurrency,
                    image=args.image,
                    memory=args.memory,
                )
                summaries[name] = asyncio.run(_run(url, tasks, config, console, name))
                _print_summary(console, f"scripted {name} policy", summaries[name])
                if args.out is not None:
                    console.print(f"run directory: {root / name}")
    oracle, baseline = summaries["oracle"]["success_rate"], summaries["random"]["success_rate"]
    ok = oracle == 1.0 and (baseline or 0.0) < 0.5
    console.print(
        f"[bold]{'OK' if ok else 'FAILED'}[/]: oracle {oracle}, random {baseline}"
        " (expected 1.0 and well below it)"
    )
    return 0 if ok else 1


def _cmd_judge(args: argparse.Namespace, console: Console) -> int:
    from .judges import judge_file

    model = ModelConfig(model=args.model, base_url=args.base_url, api_key_env=args.api_key_env)
    out = args.out or args.run / f"judged-{args.method}.jsonl"
    summary = asyncio.run(
        judge_file(
            args.run / "trajectories.jsonl",
            model,
            out,
            method=args.method,
            concurrency=args.concurrency,
        )
    )
    console.print(
        f"judged {summary.judged}, already judged {summary.skipped}, verdicts {summary.verdicts}"
    )
    for failure in summary.failed:
        console.print(f"[red]failed:[/] {failure}")
    console.print(f"judged trajectories: {out}")
    return 1 if summary.failed else 0


def _cmd_sft(args: argparse.Namespace, console: Console) -> int:
    from .sft import write_sft_file

    summary = write_sft_file(
        args.trajectories,
        args.out,
        min_reward=args.min_reward,
        history=args.history,
        inline_images=args.inline_images,
    )
    console.print(summary)
    return 0


def _cmd_contact_sheets(args: argparse.Namespace, console: Console) -> int:
    from orchard_env_client.trajectory import read_jsonl

    from .contact_sheet import contact_sheet

    written = 0
    for traj in read_jsonl(args.run / "trajectories.jsonl"):
        if traj.steps:
            name = f"{traj.metadata.task_id}-{traj.metadata.attempt}.png".replace("/", "_")
            contact_sheet(traj, args.run, args.run / "contact_sheets" / name)
            written += 1
    console.print(f"{written} contact sheets in {args.run / 'contact_sheets'}")
    return 0


def _cmd_bench(args: argparse.Namespace, console: Console) -> int:
    from .bench import run_bench

    tasks = [t for t in _load(args.tasks) if t.offline]
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    with _run_dir(args.out) as root, service(args.url, console.print, args.backend) as url:
        console.print(f"bench: {len(tasks)} offline tasks at concurrency {levels} ...")
        report = run_bench(url, tasks, levels, root, args.image)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    host, box = report["host"], report["sandbox"]
    table = Table(title=f"browser sandbox ({box['image']}) vs Chromium on the host")
    for column in ("measure", "sandbox p50 ms", "host p50 ms", "ratio"):
        table.add_column(column)
    for key, label in (
        ("first_screenshot", "create -> first screenshot"),
        ("click_step", "click step"),
    ):
        ours, base = box[key]["p50_ms"], host[key]["p50_ms"]
        table.add_row(label, f"{ours:.1f}", f"{base:.1f}", f"{ours / base:.2f}x")
    console.print(table)
    console.print(
        f"create -> first screenshot, p50 by part (ms): {box['first_screenshot_parts_p50_ms']}"
    )
    rows = Table(title="offline tasks, scripted oracle, N browser sandboxes at once")
    for column in (
        "N",
        "episodes",
        "success",
        "wall s",
        "episodes/min",
        "step p50 s",
        "start p50 s",
    ):
        rows.add_column(column)
    for row in report["concurrency"]:
        rows.add_row(
            *(
                str(row[k])
                for k in (
                    "concurrency",
                    "episodes",
                    "success_rate",
                    "wall_s",
                    "episodes_per_min",
                    "step_latency_p50_s",
                    "sandbox_startup_p50_s",
                )
            )
        )
    console.print(rows)
    return 0


_COMMANDS = {
    "tasks": _cmd_tasks,
    "eval": _cmd_eval,
    "demo": _cmd_demo,
    "judge": _cmd_judge,
    "sft": _cmd_sft,
    "contact-sheets": _cmd_contact_sheets,
    "bench": _cmd_bench,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``orchard-gui``."""
    args = _parser().parse_args(argv)
    console = Console(stderr=True)
    try:
        return _COMMANDS[args.command](args, console)
    except (TaskError, FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())

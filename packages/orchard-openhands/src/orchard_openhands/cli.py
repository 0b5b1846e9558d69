"""``orchard-openhands``: run the OpenHands agent on SWE tasks in Orchard sandboxes.

``orchard-openhands run ID [ID ...]`` runs each task (a built-in one, or one from
``--tasks``) once with the OpenHands agent against an OpenAI-compatible ``--base-url``,
grades the patch the SWE-bench way and appends the trajectory, verdict included, to
``--out`` (JSON lines). Prints one JSON summary line per task; exits 0 when every attempt
ran (whatever its verdict), 1 when one ended in a harness or environment error, 2 on
bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from orchard_env_client import AsyncSandboxClient
from orchard_env_client.llm import ModelConfig
from orchard_swe.tasks import BUILTIN, TaskLoadError, load_tasks
from orchard_swe.trajectory import Trajectory, append_jsonl

from .runner import RunConfig, run_task

DEFAULT_ORCHARD_URL = "http://127.0.0.1:8000"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="orchard-openhands",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the OpenHands agent on SWE tasks, grade, write JSONL")
    run.add_argument("ids", nargs="+", help="task instance ids")
    run.add_argument(
        "--tasks", default=BUILTIN, help="a task file or dataset (default: the built-in tasks)"
    )
    run.add_argument("--model", required=True, help="model name on the endpoint")
    run.add_argument(
        "--base-url",
        default=os.environ.get("OPENAI_BASE_URL"),
        help="OpenAI-compatible API root, e.g. http://127.0.0.1:8080/v1 "
        "(default: $OPENAI_BASE_URL)",
    )
    run.add_argument(
        "--api-key",
        default=None,
        help="the endpoint's key (default: $OPENAI_API_KEY; none needed locally)",
    )
    run.add_argument(
        "--orchard-url",
        default=os.environ.get("ORCHARD_ENV_URL", DEFAULT_ORCHARD_URL),
        help="the Orchard Env service (default: $ORCHARD_ENV_URL or :8000)",
    )
    run.add_argument("--orchard-api-key", default=os.environ.get("ORCHARD_ENV_API_KEY"))
    run.add_argument(
        "--image",
        default=None,
        help="sandbox image for repository tasks (default: host / orchard-test/debian)",
    )
    run.add_argument("--out", type=Path, required=True, help="JSON lines file to append to")
    run.add_argument("--attempt", type=int, default=0, help="attempt number recorded")
    run.add_argument("--max-steps", type=int, default=30, help="model calls (default 30)")
    run.add_argument(
        "--max-cost", type=float, default=3.0, help="dollars, with --price-* set (0 disables)"
    )
    run.add_argument("--max-time", type=float, default=1800, help="seconds (0 disables)")
    run.add_argument(
        "--command-timeout",
        type=float,
        default=180,
        help="default timeout of one terminal command, seconds",
    )
    run.add_argument("--temperature", type=float, default=0.0)
    run.add_argument("--price-per-1k-prompt", type=float, default=0.0)
    run.add_argument("--price-per-1k-completion", type=float, default=0.0)
    run.add_argument("--no-grade", action="store_true", help="skip grading")
    return parser


async def _run_all(args: argparse.Namespace) -> list[Trajectory]:
    tasks = load_tasks(args.tasks, ids=args.ids)
    model = ModelConfig(
        model=args.model,
        base_url=args.base_url,
        temperature=args.temperature,
        price_per_1k_prompt=args.price_per_1k_prompt,
        price_per_1k_completion=args.price_per_1k_completion,
    )
    out: list[Trajectory] = []
    async with AsyncSandboxClient(base_url=args.orchard_url, api_key=args.orchard_api_key) as c:
        backend = (await c.health()).backend
        for task in tasks:
            config = RunConfig(
                model=model,
                api_key=args.api_key,
                attempt=args.attempt,
                max_steps=args.max_steps,
                max_cost=args.max_cost,
                max_time_s=args.max_time,
                command_timeout_s=args.command_timeout,
                backend=backend,
                default_image=args.image,
                grade=not args.no_grade,
            )
            trajectory = await run_task(c, task, config)
            append_jsonl(args.out, trajectory)
            meta = trajectory.metadata
            print(
                json.dumps(
                    {
                        "task_id": meta.task_id,
                        "exit_status": meta.exit_status,
                        "verdict": meta.verdict,
                        "steps": meta.steps,
                        "duration_s": round(meta.duration_s, 1),
                        "error": meta.error,
                    }
                ),
                flush=True,
            )
            out.append(trajectory)
    return out


def main(argv: list[str] | None = None) -> int:
    """The ``orchard-openhands`` command."""
    args = _parser().parse_args(argv)
    if args.command != "run":
        return 2
    if not args.base_url:
        print("error: --base-url (or $OPENAI_BASE_URL) is required", file=sys.stderr)
        return 2
    if args.max_steps < 1:
        print("error: --max-steps must be at least 1", file=sys.stderr)
        return 2
    try:
        trajectories = asyncio.run(_run_all(args))
    except (TaskLoadError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    broken = [
        t
        for t in trajectories
        if t.metadata.exit_status.startswith("error") or t.metadata.verdict == "error"
    ]
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())

"""``orchard-swe demo``: the whole data-collection path offline, on the built-in tasks.

Both harnesses run against real sandboxes with two scripted models served by a local
OpenAI-compatible endpoint: one replays each task's gold fix, one submits at once without
changing anything. Everything is graded the SWE-bench way. Expected: gold 100% resolved,
empty 0%. Needs an Orchard Env service; if none answers at ``--url``, one is started
(``orchard-env serve`` on the embedded local backend) for the demo's duration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from orchard_env_client import AsyncSandboxClient
from orchard_env_client.llm import ModelConfig
from orchard_env_client.own_service import service

from .distill import DistillConfig, Harness, distill
from .tasks import BUILTIN, Task, load_tasks
from .testing.replay import Script, ScriptedModelServer, empty_script, gold_script

HARNESSES: tuple[Harness, ...] = ("tools", "mini")


async def distill_scripted(
    client: AsyncSandboxClient,
    tasks: Sequence[Task],
    harness: Harness,
    kind: str,
    scripts: Mapping[str, Script],
    out_dir: Path,
    *,
    concurrency: int,
    image: str | None,
) -> dict[str, Any]:
    """Distill ``tasks`` through ``harness`` with the scripted model ``scripted-<kind>``,
    which plays ``scripts[instance_id]`` for each task; trajectories go to ``out_dir``,
    the run's summary is returned."""
    with ScriptedModelServer() as server:
        for task in tasks:
            server.add(task.instance_id, scripts[task.instance_id])
        config = DistillConfig(
            harness=harness,
            model=ModelConfig(model=f"scripted-{kind}", base_url=server.base_url),
            out_dir=out_dir,
            concurrency=concurrency,
            default_image=image,
        )
        return await distill(client, tasks, config)


async def _run_all(
    url: str, api_key: str | None, out: Path, concurrency: int, image: str | None
) -> dict[tuple[str, str], dict[str, Any]]:
    tasks = load_tasks(BUILTIN)
    summaries: dict[tuple[str, str], dict[str, Any]] = {}
    async with AsyncSandboxClient(base_url=url, api_key=api_key) as client:
        for harness in HARNESSES:
            for kind in ("gold", "empty"):
                scripts = {
                    t.instance_id: gold_script(t.patch, harness)
                    if kind == "gold"
                    else empty_script(harness)
                    for t in tasks
                }
                summaries[(harness, kind)] = await distill_scripted(
                    client,
                    tasks,
                    harness,
                    kind,
                    scripts,
                    out / f"{harness}-{kind}",
                    concurrency=concurrency,
                    image=image,
                )
    return summaries


def run_demo(
    url: str,
    api_key: str | None,
    out: Path,
    concurrency: int,
    image: str | None,
    console: Console,
) -> int:
    """Run the demo; 0 when gold resolves every task and empty none, else 1."""
    with service(url, console.print) as live:
        summaries = asyncio.run(_run_all(live, api_key, out, concurrency, image))
    table = Table(title=f"orchard-swe demo: built-in tasks, trajectories in {out}/")
    for col in ("harness", "model", "attempts", "resolved", "rate", "verify status"):
        table.add_column(col)
    ok = True
    for (harness, kind), s in summaries.items():
        table.add_row(
            harness,
            f"scripted-{kind}",
            str(s["attempts"]),
            str(s["resolved"]),
            f"{s['resolved_rate']:.0%}",
            str(s["verify_status"]),
        )
        expected = 1.0 if kind == "gold" else 0.0
        ok = ok and s["attempts"] > 0 and s["resolved_rate"] == expected
    console.print(table)
    console.print("[green]as expected[/green]" if ok else "[red]unexpected results[/red]")
    return 0 if ok else 1

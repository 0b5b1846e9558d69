"""``orchard-gui bench``: what a browser sandbox costs, beside Chromium on the bare host.

Three measurements, each printed next to its baseline:

1. **Create -> first screenshot**: a new sandbox, Chromium started in it (Playwright shipped
   in where the image lacks it) and the first screenshot of a page, against the same
   Playwright + Chromium launch and screenshot run directly on the host, no sandbox.
2. **Step latency**: a click (action -> settled page -> new screenshot, through the
   service's port forwarding) in the sandbox, against the same click and screenshot on the
   host.
3. **Concurrency**: the offline tasks solved by the scripted oracle with 1, 2, 4 ...
   browser sandboxes at once: success rate, wall time and episodes per minute, to find how
   many run at once at 100 % success on the machine.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from orchard_env_client import AsyncSandboxClient
from orchard_env_client.llm import ModelConfig
from orchard_env_client.testing import ScriptedModelServer

from .browser import BrowserSession
from .harness import HarnessConfig
from .runner import EvalConfig, default_image, evaluate
from .scripted import oracle_responder
from .tasks import WebTask

__all__ = ["PAGE", "bench_concurrency", "bench_host", "bench_sandboxed"]

PAGE: Final = (
    "data:text/html,<title>bench</title><button id=b style='position:absolute;left:40px;"
    "top:40px;width:160px;height:50px' onclick=\"this.textContent='clicked '+(+this.dataset"
    '.n+1||1);this.dataset.n=+this.dataset.n+1||1">Press</button>'
)
"""The page both sides load: a button to click."""
_CLICK_AT: Final = (120, 65)
_CLICK: Final = {"action": "click", "x": _CLICK_AT[0], "y": _CLICK_AT[1]}


def _ms(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
        "n": len(ordered),
    }


async def bench_sandboxed(
    client: AsyncSandboxClient, *, image: str | None = None, samples: int = 3, clicks: int = 10
) -> dict[str, Any]:
    """Create -> first screenshot and click latency in real sandboxes (``samples`` of them)."""
    chosen = image or default_image((await client.health()).backend)
    first: list[float] = []
    steps: list[float] = []
    parts: dict[str, list[float]] = {"create": [], "provision": [], "server_start": [], "reset": []}
    for _ in range(samples):
        started = time.monotonic()
        sandbox = await client.create_sandbox(chosen, memory="2Gi")
        parts["create"].append(time.monotonic() - started)
        try:
            async with await BrowserSession.start(sandbox) as browser:
                parts["provision"].append(browser.timings["provision"])
                parts["server_start"].append(browser.timings["server_start"])
                reset_at = time.monotonic()
                await browser.reset(PAGE, marks=False)
                parts["reset"].append(time.monotonic() - reset_at)
                first.append(time.monotonic() - started)
                for _ in range(clicks):
                    acted = time.monotonic()
                    result = await browser.step(_CLICK, marks=False)
                    steps.append(time.monotonic() - acted)
                    if not result.ok:
                        raise RuntimeError(f"bench click failed: {result.error}")
        finally:
            await sandbox.delete()
    return {
        "image": chosen,
        "first_screenshot": _ms(first),
        "click_step": _ms(steps),
        "first_screenshot_parts_p50_ms": {k: _ms(v)["p50_ms"] for k, v in parts.items()},
    }


def bench_host(
    *, chromium: str = "/usr/bin/chromium", samples: int = 3, clicks: int = 10
) -> dict[str, Any]:
    """The baseline: the same launch, page, screenshot and clicks with Playwright on the host."""
    from playwright.sync_api import sync_playwright

    first: list[float] = []
    steps: list[float] = []
    for _ in range(samples):
        started = time.monotonic()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True)
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.goto(PAGE)
            page.screenshot()
            first.append(time.monotonic() - started)
            for _ in range(clicks):
                acted = time.monotonic()
                page.mouse.click(*_CLICK_AT)
                page.wait_for_load_state()
                page.screenshot()
                steps.append(time.monotonic() - acted)
            browser.close()
    return {"first_screenshot": _ms(first), "click_step": _ms(steps)}


async def bench_concurrency(
    client: AsyncSandboxClient,
    tasks: Sequence[WebTask],
    levels: Sequence[int],
    out_dir: Path,
    *,
    image: str | None = None,
) -> list[dict[str, Any]]:
    """The oracle on ``tasks`` at each concurrency level: success, wall time, throughput."""
    rows = []
    with ScriptedModelServer() as llm:
        llm.set_default(None)
        for task in tasks:
            llm.add(task.task_id, oracle_responder(tasks))
        for level in levels:
            run = out_dir / f"c{level}"
            if (run / "trajectories.jsonl").exists():  # a resumed run would skew the rates
                raise FileExistsError(f"{run} holds an earlier run: give --out a new directory")
            config = EvalConfig(
                out_dir=run,
                model=ModelConfig(
                    model="scripted-oracle",
                    base_url=llm.base_url,
                    api_key_env="ORCHARD_GUI_SCRIPTED_NO_KEY",
                ),
                harness=HarnessConfig(max_steps=30, max_time_s=180),
                concurrency=level,
                image=image,
                contact_sheets=False,
            )
            started = time.monotonic()
            summary = await evaluate(client, tasks, config)
            wall = time.monotonic() - started
            rows.append(
                {
                    "concurrency": level,
                    "episodes": summary["episodes"],
                    "success_rate": summary["success_rate"],
                    "wall_s": round(wall, 1),
                    "episodes_per_min": round(60 * summary["episodes"] / wall, 1),
                    "step_latency_p50_s": summary["step_latency_p50_s"],
                    "sandbox_startup_p50_s": summary["sandbox_startup_p50_s"],
                }
            )
    return rows


def run_bench(
    url: str, tasks: Sequence[WebTask], levels: Sequence[int], out_dir: Path, image: str | None
) -> dict[str, Any]:
    """All three measurements (the host baseline runs first, outside the event loop)."""
    host = bench_host()

    async def sandboxed() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        async with AsyncSandboxClient(url) as client:
            single = await bench_sandboxed(client, image=image)
            rows = await bench_concurrency(client, tasks, levels, out_dir, image=image)
            return single, rows

    single, rows = asyncio.run(sandboxed())
    return {"host": host, "sandbox": single, "concurrency": rows}

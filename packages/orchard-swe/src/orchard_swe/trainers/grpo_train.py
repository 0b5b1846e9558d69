"""``orchard-swe train-grpo``: a few GRPO steps (TRL, CPU) with BAR groups and sandbox rewards.

The workspace venv has no torch, so training runs in the training venv as
``grpo_train_worker.py`` (:func:`~.worker.run_worker`); this module is its front end: it
finds or starts the Orchard Env server (``--server-url``, or a throwaway local server on
``--backend``), picks the sandbox image, runs the worker, and checks that no sandbox was
left behind. ``orchard-swe train-grpo`` (:mod:`orchard_swe.cli.grpo`) prints a summary of
``OUT/report.json``. See ``docs/swe-grpo.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.markup import escape

from orchard_env_client import AsyncSandboxClient, own_service

from .trl_grpo import SANDBOX_LABELS, GrpoRunConfig, OrchardUnavailable, SandboxExecutor
from .worker import WorkerError, run_worker

__all__ = [
    "BACKENDS",
    "EXIT_NO_SERVER",
    "GRPO_WORKER",
    "default_image",
    "train_grpo",
]

BACKENDS = ("local", "docker", "kubernetes")
EXIT_NO_SERVER = 3  # the worker's exit status when the Orchard server cannot be reached
GRPO_WORKER: Final = "orchard_swe.trainers.grpo_train_worker"
"""The worker module, run in the training venv."""


def default_image(backend: str) -> str:
    """The image training sandboxes use on ``backend`` when none is given."""
    return "host" if backend == "local" else "orchard-test/debian"


@contextlib.contextmanager
def _server(server_url: str | None, backend: str) -> Iterator[str]:
    """``server_url`` as is, or a throwaway server on ``backend`` for the block's duration."""
    if server_url:
        yield server_url
        return
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(own_service.started(backend))
        except RuntimeError as exc:
            raise OrchardUnavailable(f"no --server-url given and none started: {exc}") from exc
        yield url


def _train_in_worker(
    config: GrpoRunConfig,
    out: Path,
    url: str,
    image: str,
    api_key: str | None,
    console: Console | None,
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.json"
    config_path.write_text(json.dumps(config.to_dict(), indent=1) + "\n")
    env = {"TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": str(config.threads)}
    if api_key:
        env["ORCHARD_ENV_API_KEY"] = api_key

    def echo(line: str) -> None:
        if console is not None and line.startswith("[grpo-worker]"):
            console.print(escape(line.rstrip()))

    argv = ["--config", str(config_path), "--server-url", url, "--image", image, "--out", str(out)]
    try:
        return run_worker(GRPO_WORKER, argv, out, on_output=echo, merge_stderr=True, env=env)
    except WorkerError as exc:
        if exc.returncode == EXIT_NO_SERVER:
            last = exc.tail.splitlines()[-1] if exc.tail else f"no server at {url}"
            raise OrchardUnavailable(last) from None
        raise


async def _leftovers(url: str, api_key: str | None) -> list[str]:
    async with AsyncSandboxClient(base_url=url, api_key=api_key, auto_cleanup=False) as client:
        return [s.sandbox_id for s in await client.list_sandboxes(labels=SANDBOX_LABELS)]


def train_grpo(
    config: GrpoRunConfig,
    out: Path,
    *,
    server_url: str | None = None,
    backend: str = "local",
    image: str | None = None,
    api_key: str | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Train, and return the worker's report (also in ``out/report.json``).

    Adds ``server.started`` (whether a throwaway server was started),
    ``totals.sandboxes_left`` (sandboxes with this run's label still on the server after
    the run) and ``totals.frontend_wall_s``. Raises :class:`OrchardUnavailable` (no
    server), :class:`~orchard_swe.trainers.llm_venv.LLMVenvError` (no training venv) or
    :class:`~orchard_swe.trainers.worker.WorkerError` (the worker failed).
    """
    started = time.monotonic()
    with _server(server_url, backend) as url:
        found = asyncio.run(SandboxExecutor(url, image or "", api_key=api_key).check())
        chosen = image or default_image(found or backend)
        if console is not None:
            console.print(
                f"Orchard Env: {found or '?'} backend at {url}, image {chosen}"
                + ("" if server_url else " (started for this run)")
            )
        report = _train_in_worker(config, out, url, chosen, api_key, console)
        left = asyncio.run(_leftovers(url, api_key))
    report["server"]["started"] = not server_url
    report["totals"]["sandboxes_left"] = len(left)
    report["totals"]["frontend_wall_s"] = round(time.monotonic() - started, 2)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report

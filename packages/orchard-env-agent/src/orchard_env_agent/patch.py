"""apply_patch: git apply, then a 3-way apply, then patch --fuzz, as sandbox commands."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .context import SandboxContext
from .jobs import Job
from .runner import start_job

ATTEMPTS: list[tuple[str, list[str], list[str] | None]] = [
    ("git apply", ["git", "apply", "--whitespace=nowarn", "-"], None),
    ("git apply --3way", ["git", "apply", "--3way", "--whitespace=nowarn", "-"], None),
    (
        "patch -p1",
        ["patch", "-p1", "--fuzz=3", "--batch", "--forward", "--no-backup-if-mismatch"],
        ["--dry-run"],
    ),
    (
        "patch -p0",
        ["patch", "-p0", "--fuzz=3", "--batch", "--forward", "--no-backup-if-mismatch"],
        ["--dry-run"],
    ),
]


async def _run(ctx: SandboxContext, argv: list[str], patch: str, timeout: float, cap: int) -> Job:
    job = start_job(ctx, argv, cap=cap, timeout=max(timeout, 0.1), stdin=patch)
    await job.done.wait()
    return job


async def apply_patch(ctx: SandboxContext, patch: str, timeout: float, cap: int) -> dict[str, Any]:
    if not patch.endswith("\n"):
        patch += "\n"
    deadline = time.monotonic() + timeout
    last: tuple[str, Job] | None = None
    for method, argv, dry in ATTEMPTS:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if dry is not None:  # patch(1) applies hunks partially: check first
            probe = await _run(ctx, argv + dry, patch, remaining, cap)
            if probe.exit_code != 0:
                last = (method, probe)
                continue
            remaining = deadline - time.monotonic()
        job = await _run(ctx, argv, patch, remaining, cap)
        last = (method, job)
        if job.exit_code == 0:
            break
        await asyncio.sleep(0)
    if last is None:
        return {
            "success": False,
            "stdout": "",
            "stderr": "apply_patch timed out",
            "exit_code": None,
            "method": None,
        }
    method, job = last
    d = job.to_dict()
    return {
        "success": job.exit_code == 0,
        "stdout": d["stdout"],
        "stderr": d["stderr"] or (d["error"] or ""),
        "exit_code": job.exit_code,
        "method": method,
    }

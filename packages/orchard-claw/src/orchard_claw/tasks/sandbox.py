"""A task in a sandbox: seed ``/workspace``, start its service, run the reference, check.

All of it goes through the ``AsyncSandbox`` of ``orchard_env_client``; nothing here knows
the backend. Service files live under ``SERVICE_DIR`` (outside ``/workspace``).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from importlib import resources
from pathlib import Path

from orchard_claw.tasks.checkers import FinalState, get_checker
from orchard_claw.tasks.schema import WORKSPACE, CheckResult, ClawTask, TaskError
from orchard_env_client import AsyncSandbox, models
from orchard_env_client.errors import OrchardError

__all__ = [
    "SERVICE_DIR",
    "check",
    "prepare",
    "reset_workspace",
    "run_reference",
    "seed_workspace",
    "snapshot",
    "start_service",
    "stop_service",
]

SERVICE_DIR = "/tmp/orchard-claw/service"
"""The service script, its seed and its persisted state, inside the sandbox."""
SERVICE_TIMEOUT_S = 86_400
"""The background service job's kill timer (the service's maximum)."""


async def stop_service(sandbox: AsyncSandbox) -> None:
    """Stop a task service started by ``start_service`` (by its pid file; none is fine)."""
    script = (
        f"pid=$(cat {SERVICE_DIR}/pid 2>/dev/null) || exit 0\n"
        'kill "$pid" 2>/dev/null\n'
        'for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done\n'
        f"rm -f {SERVICE_DIR}/pid\n"
    )
    await sandbox.exec(script, timeout=30)


async def reset_workspace(sandbox: AsyncSandbox) -> None:
    """Stop the task service and empty ``/workspace`` (for reusing a sandbox across tasks)."""
    await stop_service(sandbox)
    job = await sandbox.exec(
        f"mkdir -p {WORKSPACE} && find {WORKSPACE} -mindepth 1 -delete", timeout=60
    )
    if not job.succeeded:
        raise TaskError(f"could not empty {WORKSPACE}: {job.stderr.strip()[-500:]}")


async def seed_workspace(sandbox: AsyncSandbox, task: ClawTask, *, reset: bool = True) -> None:
    """Write the task's files (and ``API.md`` for its service) under ``/workspace``.

    With ``reset`` (default) the workspace is emptied and any task service stopped first.
    """
    if reset:
        await reset_workspace(sandbox)
    files = dict(task.files)
    if task.service is not None and task.service.docs:
        files.setdefault("API.md", task.service.docs)
    if not files:
        return
    with tempfile.TemporaryDirectory(prefix="claw-seed-") as tmp:
        root = Path(tmp)
        for rel, content in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
        await sandbox.upload_dir(root, WORKSPACE)


async def _service_up(sandbox: AsyncSandbox, port: int) -> bool:
    try:
        response = await sandbox.port_request(port, "GET", "_health", timeout=10)
    except OrchardError:
        return False
    return response.status_code == 200


async def start_service(
    sandbox: AsyncSandbox,
    task: ClawTask,
    *,
    python: str = "python3",
    startup_timeout: float = 30.0,
) -> None:
    """Start the task's records service on ``127.0.0.1:<port>`` and wait until it answers.

    Does nothing for a task without a service. A running task service is stopped first, so
    the new one starts from the task's initial state.
    """
    service = task.service
    if service is None:
        return
    await stop_service(sandbox)
    script = resources.files("orchard_claw.tasks").joinpath("data", "service.py").read_bytes()
    await sandbox.upload_content(f"{SERVICE_DIR}/service.py", script)
    await sandbox.upload_content(f"{SERVICE_DIR}/seed.json", json.dumps(service.collections))
    job = await sandbox.start(
        [
            python,
            f"{SERVICE_DIR}/service.py",
            "--port",
            str(service.port),
            "--state",
            f"{SERVICE_DIR}/seed.json",
            "--persist",
            f"{SERVICE_DIR}/state.json",
            "--pid-file",
            f"{SERVICE_DIR}/pid",
        ],
        timeout=SERVICE_TIMEOUT_S,
    )
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if await _service_up(sandbox, service.port):
            return
        if await job.status() in ("succeeded", "failed"):
            done = await job.refresh()
            raise TaskError(
                f"task {task.id}: the {service.name} service exited (code {done.exit_code}) "
                f"before answering: {(done.stderr or done.stdout).strip()[-2000:]}"
            )
        await asyncio.sleep(0.1)
    await job.cancel()
    raise TaskError(f"task {task.id}: the {service.name} service did not answer in time")


async def prepare(sandbox: AsyncSandbox, task: ClawTask) -> None:
    """``seed_workspace`` then ``start_service``: the sandbox is ready for the agent."""
    await seed_workspace(sandbox, task)
    await start_service(sandbox, task)


async def run_reference(
    sandbox: AsyncSandbox, task: ClawTask, *, timeout: float = 120
) -> models.Job:
    """Run the task's reference solution in ``/workspace`` (``TaskError`` if it fails)."""
    job = await sandbox.exec(
        ["bash", "-euo", "pipefail", "-c", task.reference], cwd=WORKSPACE, timeout=timeout
    )
    if not job.succeeded:
        raise TaskError(
            f"task {task.id}: the reference solution failed (exit {job.exit_code}): "
            f"{(job.stderr or job.stdout).strip()[-2000:]}"
        )
    return job


async def snapshot(sandbox: AsyncSandbox, task: ClawTask, local_dir: Path) -> FinalState:
    """Copy ``/workspace`` into ``local_dir`` and read the service's state (``None`` if it
    does not answer)."""
    await sandbox.download_dir(WORKSPACE, local_dir)
    state: dict[str, list[dict[str, object]]] | None = None
    if task.service is not None:
        try:
            response = await sandbox.port_request(
                task.service.port, "GET", "_state", timeout=10, max_bytes=16 << 20
            )
            if response.status_code == 200:
                data = response.json()
                state = data if isinstance(data, dict) else None
        except (OrchardError, ValueError):
            state = None
    return FinalState(root=local_dir, service=state)


async def check(sandbox: AsyncSandbox, task: ClawTask) -> CheckResult:
    """Grade the sandbox's final state with the task's checker."""
    checker = get_checker(task.checker)
    with tempfile.TemporaryDirectory(prefix="claw-check-") as tmp:
        state = await snapshot(sandbox, task, Path(tmp))
        return checker(task, state)

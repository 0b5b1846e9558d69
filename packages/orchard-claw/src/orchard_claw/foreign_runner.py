"""Run a foreign harness (openclaw, codex, opencode) inside a sandbox, its model calls
recorded on the way out.

The wiring, for a sandbox whose network is blocked::

    harness in the sandbox --> http://127.0.0.1:4000/r/<run>/v1   (a service bridge)
        --> agent --> orchestrator --> RecordingProxy on the host --> the real model

:func:`recording_proxy` starts the proxy in front of the model (``exchanges.jsonl`` in the
run directory records every call); sandboxes are created with ``bridges={4000: <proxy>}``
(:func:`bridges_for`); :func:`run_foreign_episode` writes the harness's config files, runs
it non-interactively with the task's instruction and turns the recorded calls of that run
into a trajectory in our schema (:func:`orchard_env_client.recording_proxy.to_trajectory`),
so it loads with the same reader as our own harness's.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from orchard_env_client import AsyncSandbox
from orchard_env_client.llm import ModelConfig
from orchard_env_client.recording_proxy import RecordingProxy, to_trajectory
from orchard_env_client.trajectory import Trajectory, TrajectoryMetadata, error_status

from .foreign import HARNESSES, HarnessRun
from .tasks import ClawTask

__all__ = [
    "BRIDGE_PORT",
    "ProxyHandle",
    "bridges_for",
    "foreign_instruction",
    "recording_proxy",
    "run_foreign_episode",
]

BRIDGE_PORT: Final = 4000
"""The sandbox port whose service bridge leads to the recording proxy."""
ProxyHandle = RecordingProxy


@contextlib.contextmanager
def recording_proxy(model_base_url: str, run_dir: str | Path) -> Iterator[RecordingProxy]:
    """A recording proxy in front of ``model_base_url`` (an OpenAI-compatible root ending
    in ``/v1``), recording into ``<run_dir>/exchanges.jsonl``; stopped on exit."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with RecordingProxy(model_base_url, Path(run_dir) / "exchanges.jsonl") as proxy:
        yield proxy


def bridges_for(proxy: RecordingProxy) -> dict[int | str, str]:
    """The ``bridges`` of a sandbox whose harness calls the model through ``proxy``."""
    return {BRIDGE_PORT: proxy.base_url.removesuffix("/v1")}


def foreign_instruction(task: ClawTask) -> str:
    """The task as a foreign harness gets it: the instruction, plus where the task's
    service answers (our harness offers it as a tool instead)."""
    text = task.instruction.strip()
    if task.service is not None:
        text += (
            f"\n\nThe task's local service answers at http://127.0.0.1:{task.service.port}"
            f" (call it with curl or python3). {task.service.docs.strip()}"
        )
    return text


async def run_foreign_episode(
    sandbox: AsyncSandbox,
    task: ClawTask,
    model: ModelConfig,
    proxy: RecordingProxy,
    *,
    harness: str,
    attempt: int = 0,
    timeout_s: float = 600.0,
) -> Trajectory:
    """Run ``harness`` on ``task`` in a seeded ``sandbox`` created with
    :func:`bridges_for` ``(proxy)``; never raises for what happens inside the run."""
    adapter = HARNESSES[harness]
    run_id = f"{task.id}-{attempt}-{uuid.uuid4().hex[:8]}"
    run = HarnessRun(
        model=model.model,
        base_url=f"http://127.0.0.1:{BRIDGE_PORT}/r/{run_id}/v1",
        task=foreign_instruction(task),
        timeout_s=timeout_s,
    )
    metadata = TrajectoryMetadata(
        task_id=task.id, recipe="claw", harness=harness, model=model.model, attempt=attempt
    )
    started_at, t0 = time.time(), time.monotonic()
    extra: dict[str, object] = {"instruction": run.task, "run_id": run_id}
    try:
        invocation = adapter.invocation(run)
        for path, content in invocation.files.items():
            await sandbox.upload_content(path, content)
        job = await sandbox.exec(
            invocation.argv,
            env=dict(invocation.env),
            cwd=invocation.cwd,
            stdin=invocation.stdin,
            timeout=invocation.exec_timeout_s,
        )
        result = adapter.parse(job.stdout, job.exit_code)
        metadata.exit_status = result.exit_status
        metadata.final_output = result.final_text
        metadata.error = result.error
        extra.update(
            exit_code=job.exit_code,
            harness_turns=result.turns,
            harness_tool_calls=result.tool_calls,
            stderr_tail=job.stderr[-2000:],
        )
    except Exception as exc:
        metadata.exit_status = error_status(exc)
        metadata.error = f"{type(exc).__name__}: {exc}"
    metadata.started_at, metadata.finished_at = started_at, time.time()
    metadata.duration_s = time.monotonic() - t0
    metadata.extra = extra
    return to_trajectory(proxy.exchanges(run_id), metadata)

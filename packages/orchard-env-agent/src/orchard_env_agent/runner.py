"""Starting a command as a job inside a sandbox context."""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import time
from dataclasses import dataclass

from . import enter
from .context import DEFAULT_PATH, SandboxContext
from .jobs import Job
from .process import ExitInfo, Running, spawn
from .spawner import spawner_for

DEFAULT_TIMEOUT = 300.0


def build_argv(ctx: SandboxContext, command: str | list[str], login_shell: bool) -> list[str]:
    if isinstance(command, list):
        return list(command)
    shell = "bash" if ctx.has_bash else "sh"
    return [shell, "-lc" if login_shell else "-c", command]


NO_HELPER = (
    "orchard-enter, which starts commands inside isolated sandboxes, is not available "
    "(it is built on first use with the machine's C compiler): refusing to run the "
    "command unconfined"
)


def _fail(job: Job, ctx: SandboxContext, exit_code: int | None, error: str) -> Job:
    job.status = "failed"
    job.exit_code = exit_code
    job.error = error
    job.started_at = job.started_at or time.time()
    if exit_code == 127:
        job.feed("stderr", (error + "\n").encode())
    job.finish()
    ctx.jobs.mark_finished(job)
    return job


@dataclass(frozen=True)
class _Launch:
    """How a command is started: its argv (through the enter helper when the sandbox has
    a holder process), the host cwd for Popen, the directory that must exist, the cgroups
    the child joins itself, and its environment."""

    argv: list[str]
    popen_cwd: str | None
    probe: str
    cgroup_procs: list[str]
    env: dict[str, str]


def _launch(ctx: SandboxContext, argv: list[str], workdir: str, env: dict[str, str]) -> _Launch:
    """Raises ``LookupError`` when the sandbox needs the enter helper and there is none."""
    if ctx.holder_pid is None:
        return _Launch(argv, workdir, workdir, ctx.cgroup_procs, env)
    helper = enter.helper()
    if helper is None:
        raise LookupError(NO_HELPER)
    entered = enter.enter_argv(
        helper, ctx.holder_pid, workdir, ctx.cgroup_procs, argv, user=ctx.user
    )
    # the helper joins the cgroups itself
    return _Launch(
        entered, None, f"/proc/{ctx.holder_pid}/root{workdir}", [], enter.helper_env(env)
    )


def _through_spawner(
    ctx: SandboxContext,
    job: Job,
    argv: list[str],
    workdir: str,
    env: dict[str, str],
    stdin: bytes | None,
) -> Running | None:
    """The command started by the sandbox's spawner (an isolated local sandbox's); None
    when it has none or cannot take this one (the caller starts it the one-shot way)."""
    spawner = spawner_for(ctx)
    if spawner is None:
        return None
    return spawner.spawn(
        argv,
        cwd=workdir,
        env=env,
        stdin=stdin,
        on_stdout=lambda b: job.feed("stdout", b),
        on_stderr=lambda b: job.feed("stderr", b),
    )


def _settle(job: Job, info: ExitInfo, timeout: float) -> None:
    """The job's final status from how its process ended."""
    job.usage = info.usage
    job.exit_code = info.returncode
    if info.error is not None and not (job.timed_out or job.cancelled):
        job.status = "failed"
        job.error = info.error
    elif job.timed_out:
        job.status, job.exit_code = "failed", None
        job.error = f"timed out after {timeout:g}s; the process group was killed"
    elif job.cancelled:
        job.status, job.exit_code = "failed", None
        job.error = "cancelled; the process group was killed"
    elif info.signal is not None:
        job.status = "failed"
        job.error = f"killed by signal {info.signal}"
    elif info.returncode == 0:
        job.status = "succeeded"
    else:
        job.status = "failed"


def start_job(
    ctx: SandboxContext,
    command: str | list[str],
    *,
    cap: int,
    timeout: float | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    login_shell: bool = False,
    stdin: str | None = None,
    listen: asyncio.Queue[tuple[str, str] | None] | None = None,
    job_id: str | None = None,
) -> Job:
    """Start ``command`` in the sandbox as a new job (failed at once if it cannot start)."""
    job = ctx.jobs.new(command, cap, job_id)
    if listen is not None:
        job.listeners.append(listen)
    limit = DEFAULT_TIMEOUT if timeout is None else timeout
    full_env = {**ctx.env, **(env or {})}
    full_env.setdefault("PATH", DEFAULT_PATH)
    workdir = cwd or ctx.workdir or "/"
    if not workdir.startswith("/"):
        workdir = os.path.join(ctx.workdir or "/", workdir)
    argv = build_argv(ctx, command, login_shell)
    if not argv:
        return _fail(job, ctx, None, "empty command")
    try:
        launch = _launch(ctx, argv, workdir, full_env)
    except LookupError as exc:
        return _fail(job, ctx, None, str(exc))
    if not os.path.isdir(launch.probe):
        return _fail(job, ctx, None, f"cwd {workdir!r} is not a directory in the sandbox")
    loop = asyncio.get_running_loop()
    stdin_bytes = stdin.encode() if stdin else None
    try:
        proc = _through_spawner(ctx, job, argv, workdir, full_env, stdin_bytes) or spawn(
            launch.argv,
            cwd=launch.popen_cwd,
            env=launch.env,
            stdin=stdin_bytes,
            on_stdout=lambda b: job.feed("stdout", b),
            on_stderr=lambda b: job.feed("stderr", b),
            cgroup_procs=launch.cgroup_procs,
        )
    except FileNotFoundError:
        return _fail(job, ctx, 127, f"{shlex.quote(launch.argv[0])}: command not found")
    except PermissionError:
        return _fail(job, ctx, 126, f"{shlex.quote(launch.argv[0])}: permission denied")
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return _fail(job, ctx, None, f"could not start the command: {exc}")
    job.proc = proc
    job.status = "running"
    job.started_at = time.time()

    def on_timeout() -> None:
        if not job.finished:
            job.timed_out = True
            proc.kill_group()

    timer = loop.call_later(limit, on_timeout) if limit > 0 else None

    def on_exit(fut: asyncio.Future[ExitInfo]) -> None:
        if timer is not None:
            timer.cancel()
        _settle(job, fut.result(), limit)
        job.finish()
        ctx.jobs.mark_finished(job)

    proc.exited.add_done_callback(on_exit)
    return job


def cancel_job(job: Job) -> None:
    if not job.finished:
        job.cancelled = True
        job.kill()

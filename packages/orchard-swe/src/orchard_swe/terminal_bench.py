"""Terminal-Bench-format tasks (Terminal-Bench 2.0 / Harbor layout) as our SWE ``Task``.

A task directory holds::

    task.toml              [environment] docker_image (or environment/Dockerfile), timeouts
    instruction.md         what the agent is asked to do
    environment/           files put in the working directory (with a prebuilt image)
    solution/solve.sh      the oracle solution
    tests/test.sh          the verifier: writes /logs/verifier/reward.txt (or reward.json)

``load_task`` reads one into a ``Task`` whose ``problem_statement`` is the instruction and
``image_name`` the image; everything Terminal-Bench-specific sits in ``extra``
(``extra["terminal_bench"]``, a ``TerminalBenchSpec`` as a dict). ``prepare``,
``run_oracle`` and ``run_verifier`` do in an Orchard sandbox what Harbor does in its
environments: the log dirs, the environment files, ``solve.sh`` from ``/solution``,
``test.sh`` from ``/tests``, and the reward read back. ``run_attempt`` runs any of our
harnesses on such a task and verifies the result the same way. A task with only a Dockerfile is
loaded (``dockerfile`` set, ``image_name`` None) for a runner that builds it; the image
store of a non-Docker Orchard backend cannot build one (docs/harbor.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from orchard_env_client import AsyncSandbox, AsyncSandboxClient

from .distill import HarnessRun, failed_trajectory
from .tasks import Task, TaskLoadError
from .trajectory import TIME_LIMIT, Trajectory

VERIFIER_LOGS = "/logs/verifier"
AGENT_LOGS = "/logs/agent"
ARTIFACTS = "/logs/artifacts"
SOLUTION_DIR = "/solution"
TESTS_DIR = "/tests"
REPO_PREFIX = "terminal-bench/"
"""``Task.repo`` of a loaded task: ``terminal-bench/<task name>`` (there is no repository)."""


@attrs.frozen
class TerminalBenchSpec:
    """What a Terminal-Bench task needs beyond ``Task``'s SWE fields."""

    task_dir: str
    instruction: str
    docker_image: str | None
    dockerfile: str | None
    workdir: str | None
    agent_timeout_sec: float
    verifier_timeout_sec: float
    environment_files: tuple[str, ...]
    env: Mapping[str, str] = attrs.field(factory=dict)

    @classmethod
    def of(cls, task: Task) -> TerminalBenchSpec:
        """The spec of a task ``load_task`` made (ValueError for any other task)."""
        raw = task.extra.get("terminal_bench")
        if not isinstance(raw, Mapping):
            raise ValueError(f"{task.instance_id} is not a Terminal-Bench task")
        return cls(
            task_dir=str(raw["task_dir"]),
            instruction=str(raw["instruction"]),
            docker_image=raw.get("docker_image"),
            dockerfile=raw.get("dockerfile"),
            workdir=raw.get("workdir"),
            agent_timeout_sec=float(raw["agent_timeout_sec"]),
            verifier_timeout_sec=float(raw["verifier_timeout_sec"]),
            environment_files=tuple(raw.get("environment_files") or ()),
            env=dict(raw.get("env") or {}),
        )


def _section(config: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = config.get(name) or {}
    if not isinstance(value, Mapping):
        raise ValueError(f"[{name}] must be a table")
    return value


def load_task(task_dir: str | Path) -> Task:
    """Read one Terminal-Bench task directory; ``TaskLoadError`` lists what is wrong."""
    root = Path(task_dir).resolve()
    problems = [
        f"missing {part}"
        for part in ("task.toml", "instruction.md", "tests/test.sh")
        if not (root / part).is_file()
    ]
    if problems:
        raise TaskLoadError(str(root), problems)
    try:
        config = tomllib.loads((root / "task.toml").read_text(encoding="utf-8"))
        environment = _section(config, "environment")
        agent = _section(config, "agent")
        verifier = _section(config, "verifier")
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise TaskLoadError(str(root), [f"task.toml: {exc}"]) from None
    env_dir = root / "environment"
    dockerfile = env_dir / "Dockerfile"
    image = environment.get("docker_image") or None
    if image is None and not dockerfile.is_file():
        raise TaskLoadError(
            str(root), ["no [environment].docker_image and no environment/Dockerfile"]
        )
    files = (
        sorted(str(p.relative_to(env_dir)) for p in env_dir.rglob("*") if p.is_file())
        if env_dir.is_dir() and image is not None and not dockerfile.exists()
        else []
    )
    instruction = (root / "instruction.md").read_text(encoding="utf-8")
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    spec = TerminalBenchSpec(
        task_dir=str(root),
        instruction=instruction,
        docker_image=image,
        dockerfile=str(dockerfile) if dockerfile.is_file() else None,
        workdir=environment.get("workdir") or None,
        agent_timeout_sec=float(agent.get("timeout_sec", 600.0)),
        verifier_timeout_sec=float(verifier.get("timeout_sec", 600.0)),
        environment_files=tuple(files),
        env={str(k): str(v) for k, v in (environment.get("env") or {}).items()},
    )
    solution = root / "solution" / "solve.sh"
    return Task(
        instance_id=root.name,
        repo=REPO_PREFIX + root.name,
        base_commit=digest.hexdigest()[:40],
        problem_statement=instruction,
        image_name=image,
        extra={
            "terminal_bench": attrs.asdict(spec),
            "metadata": dict(_section(config, "metadata")),
            "has_oracle": solution.is_file(),
        },
    )


def is_task_tree(path: str | Path) -> bool:
    """Whether ``path`` is a Terminal-Bench task directory or a directory of them."""
    root = Path(path)
    if not root.is_dir():
        return False
    return (root / "task.toml").is_file() or any(
        (child / "task.toml").is_file() for child in root.iterdir()
    )


def is_terminal_bench_task(task: Task) -> bool:
    """Whether ``task`` came from :func:`load_task`."""
    return "terminal_bench" in task.extra


def load_tasks(path: str | Path) -> list[Task]:
    """One task directory, or a directory of them (each with a ``task.toml``)."""
    root = Path(path)
    if (root / "task.toml").is_file():
        return [load_task(root)]
    dirs = sorted(p for p in root.iterdir() if (p / "task.toml").is_file())
    if not dirs:
        raise TaskLoadError(str(root), ["no task.toml here or in any subdirectory"])
    return [load_task(d) for d in dirs]


async def _workdir(sandbox: AsyncSandbox, spec: TerminalBenchSpec) -> str:
    if spec.workdir:
        return spec.workdir
    job = await sandbox.exec("pwd", timeout=30)
    return job.stdout.strip() or "/"


async def _checked(sandbox: AsyncSandbox, command: str, timeout: float, what: str) -> None:
    job = await sandbox.exec(command, timeout=timeout)
    if job.exit_code != 0:
        raise RuntimeError(f"{what} failed ({job.exit_code}): {job.stderr or job.stdout}")


async def prepare(sandbox: AsyncSandbox, task: Task) -> str:
    """Set a fresh sandbox up as Harbor does: the log dirs, then the task's environment
    files in the working directory (prebuilt-image tasks). Returns the working directory."""
    spec = TerminalBenchSpec.of(task)
    dirs = " ".join(shlex.quote(d) for d in (VERIFIER_LOGS, AGENT_LOGS, ARTIFACTS))
    await _checked(sandbox, f"mkdir -p {dirs} && chmod 777 {dirs}", 30, "creating log dirs")
    workdir = await _workdir(sandbox, spec)
    if spec.environment_files:
        await sandbox.upload_dir(Path(spec.task_dir) / "environment", workdir)
    return workdir


async def _run_script(
    sandbox: AsyncSandbox,
    spec: TerminalBenchSpec,
    local_dir: str,
    remote_dir: str,
    script: str,
    timeout: float,
) -> tuple[int | None, str]:
    await sandbox.upload_dir(Path(spec.task_dir) / local_dir, remote_dir)
    job = await sandbox.exec(
        f"bash {shlex.quote(remote_dir + '/' + script)}",
        timeout=timeout,
        cwd=await _workdir(sandbox, spec),
        env=dict(spec.env) or None,
    )
    return job.exit_code, job.stdout + job.stderr


async def run_oracle(sandbox: AsyncSandbox, task: Task) -> tuple[int | None, str]:
    """Run ``solution/solve.sh`` (uploaded to ``/solution``) from the working directory."""
    spec = TerminalBenchSpec.of(task)
    return await _run_script(
        sandbox, spec, "solution", SOLUTION_DIR, "solve.sh", spec.agent_timeout_sec
    )


class VerifierError(RuntimeError):
    """The task's verifier gave no usable reward (none written, unreadable, or timed out)."""


async def run_verifier(sandbox: AsyncSandbox, task: Task) -> float:
    """Run ``tests/test.sh`` (uploaded to ``/tests``) and return its reward, as Harbor reads
    it: ``reward.json``'s ``reward``, else the number in ``reward.txt``.

    Both files are removed first, so a reward the agent wrote itself (``/logs/verifier`` is
    world-writable) never counts. Raises :class:`VerifierError` when the verifier timed out,
    wrote neither file, or wrote something that is not a number.
    """
    spec = TerminalBenchSpec.of(task)
    stale = f"{VERIFIER_LOGS}/reward.json {VERIFIER_LOGS}/reward.txt"
    await _checked(sandbox, f"rm -f {stale}", 30, "removing stale rewards")
    exit_code, output = await _run_script(
        sandbox, spec, "tests", TESTS_DIR, "test.sh", spec.verifier_timeout_sec
    )
    if exit_code is None:
        raise VerifierError(f"the verifier did not finish: {output[-2000:]}")
    listing = await sandbox.exec(
        f"cat {VERIFIER_LOGS}/reward.json 2>/dev/null; echo; echo '---'; "
        f"cat {VERIFIER_LOGS}/reward.txt 2>/dev/null",
        timeout=30,
    )
    document, _, text = listing.stdout.partition("---")
    try:
        if document.strip():
            return float(json.loads(document)["reward"])
        if text.strip():
            return float(text.strip())
    except (ValueError, KeyError, TypeError) as exc:
        raise VerifierError(f"unreadable reward ({exc}): {listing.stdout[-500:]!r}") from exc
    raise VerifierError(f"the verifier wrote no reward (exit {exit_code}): {output[-2000:]}")


async def run_attempt(
    client: AsyncSandboxClient,
    task: Task,
    run: HarnessRun,
    *,
    harness: str,
    model: str,
    attempt: int = 0,
) -> Trajectory:
    """One episode of any of our harnesses on a Terminal-Bench task, verified like Harbor.

    A fresh sandbox of the task's image, with the task's ``[environment]`` ``env`` and
    ``workdir`` for every command, is set up with :func:`prepare`; ``run`` gets it and the
    working directory (as a SWE harness gets the repository) for at most the task's
    ``[agent] timeout_sec``; then the task's verifier runs in the same sandbox, as Harbor
    runs it after an agent timeout too. The verdict is ``resolved`` at reward 1, else
    ``unresolved`` (``extra["terminal_bench"]["reward"]`` holds the reward); an environment
    failure or a harness crash is the record, verdict ``error``; an agent cut off at the
    timeout is recorded with ``exit_status`` ``time_limit`` and still verified. The sandbox
    is deleted either way.
    """
    if not task.image_name:
        error = "environment: the task names only a Dockerfile; build it and set docker_image"
        return failed_trajectory(task, attempt, harness, model, error)
    spec = TerminalBenchSpec.of(task)
    try:
        sandbox = await client.create_sandbox(
            task.image_name,
            labels={"orchard-swe-role": "terminal-bench"},
            env=dict(spec.env) or None,
            workdir=spec.workdir,
        )
    except Exception as exc:  # recorded as the attempt's result, never lost
        return failed_trajectory(task, attempt, harness, model, f"environment: {exc}")
    try:
        try:
            workdir = await prepare(sandbox, task)
        except Exception as exc:
            return failed_trajectory(task, attempt, harness, model, f"environment: {exc}")
        try:
            trajectory = await asyncio.wait_for(run(sandbox, workdir), spec.agent_timeout_sec)
        except TimeoutError:
            error = f"agent: cut off at the task's timeout_sec ({spec.agent_timeout_sec:g} s)"
            trajectory = failed_trajectory(task, attempt, harness, model, error)
            trajectory.metadata.exit_status = TIME_LIMIT
        except Exception as exc:  # a harness crash is a result too
            error = f"harness: {type(exc).__name__}: {exc}"
            return failed_trajectory(task, attempt, harness, model, error)
        try:
            reward: float | None = await run_verifier(sandbox, task)
        except Exception as exc:  # the episode is kept; the verdict says what went wrong
            reward, verify_error = None, f"verifier: {type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(Exception):
            await sandbox.delete()
    metadata = trajectory.metadata
    patch_error = metadata.extra.get("patch_error")
    if patch_error and metadata.error == f"final patch: {patch_error}":
        metadata.error = None  # the working dir is no git repository: the state is the result
    if reward is None:
        metadata.verdict = "error"
        metadata.extra["terminal_bench"] = {"reward": None, "error": verify_error}
    else:
        metadata.verdict = "resolved" if reward >= 1.0 else "unresolved"
        metadata.extra["terminal_bench"] = {"reward": reward}
    return trajectory

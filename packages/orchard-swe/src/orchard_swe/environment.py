"""A task's environment in a fresh sandbox: the repository at ``base_commit``, installed.

Per backend:

- **image tasks** (``image_name`` set, Docker/Kubernetes backends): the sandbox is that image,
  whose repository already sits at ``repo_dir`` (``/testbed`` by default, as in SWE-bench
  and SWE-rebench images) at the right commit.
- **repository tasks** (the local backend, or no image): the sandbox is ``default_image``
  and the repository is cloned into ``/workspace/repo`` at ``base_commit``. ``repo_url`` may
  be ``builtin:<bundle>`` (shipped with this package), a local path to a git repository or
  bundle (packed on this machine and uploaded, so the sandbox needs no network), or a git
  URL (cloned inside the sandbox, which then gets network access).

Then ``install_config.pre_install`` and ``install`` run in the repository directory.
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from pathlib import Path

import attrs

from orchard_env_client import AsyncSandbox, AsyncSandboxClient

from .tasks import Task

WORKSPACE_REPO = "/workspace/repo"
IMAGE_REPO = "/testbed"
_IDENTITY = "-c user.name=orchard -c user.email=orchard@localhost"
# One root commit with base_commit's tree; every other ref and object gone.
_SQUASH = (
    "git checkout -q --orphan orchard-base && git commit -q --allow-empty -m base "
    "&& git remote | xargs -r -n 1 git remote remove "
    "&& git for-each-ref --format='%(refname)' | grep -v '^refs/heads/orchard-base$' "
    "| sed 's/^/delete /' | git update-ref --no-deref --stdin "
    "&& git reflog expire --expire=now --all && git gc -q --prune=now"
)


class PrepareError(RuntimeError):
    """The task's environment could not be prepared; the message says which step failed."""


@attrs.frozen
class EnvironmentSpec:
    """Where and how a task runs on one service."""

    image: str
    repo_dir: str
    needs_network: bool


def environment_spec(task: Task, backend: str, default_image: str | None = None) -> EnvironmentSpec:
    """Pick the image and repository location for ``task`` on ``backend``."""
    if task.image_name and backend != "local" and not task.repo_url:
        return EnvironmentSpec(
            image=task.image_name,
            repo_dir=str(task.extra.get("repo_dir") or IMAGE_REPO),
            needs_network=False,
        )
    image = default_image or ("host" if backend == "local" else "orchard-test/debian")
    remote = not (task.builtin_bundle() or Path(task.source_url).exists())
    return EnvironmentSpec(image=image, repo_dir=WORKSPACE_REPO, needs_network=remote)


def _bundle_bytes(task: Task) -> bytes | None:
    """The repository as a git bundle when it is on this machine; None for remote URLs."""
    builtin = task.builtin_bundle()
    if builtin is not None:
        if not builtin.exists():
            raise PrepareError(f"{task.instance_id}: built-in bundle {builtin} is missing")
        return builtin.read_bytes()
    path = Path(task.source_url)
    if not path.exists():
        return None
    if path.is_file():
        return path.read_bytes()  # already a bundle
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "repo.bundle"
        done = subprocess.run(
            ["git", "-C", str(path), "bundle", "create", str(out), "--all"],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise PrepareError(f"cannot bundle {path}: {done.stderr.strip()}")
        return out.read_bytes()


async def _run(sandbox: AsyncSandbox, step: str, command: str, cwd: str, timeout: float) -> None:
    job = await sandbox.exec(command, cwd=cwd, timeout=timeout)
    if job.exit_code != 0:
        output = (job.stdout + job.stderr)[-2000:]
        raise PrepareError(f"{step} failed (exit {job.exit_code}): {output}")


async def prepare(
    client: AsyncSandboxClient,
    task: Task,
    *,
    backend: str | None = None,
    default_image: str | None = None,
    install_timeout: float = 1800,
    labels: dict[str, str] | None = None,
    hide_history: bool = False,
) -> tuple[AsyncSandbox, EnvironmentSpec]:
    """A new sandbox holding the task's repository at ``base_commit``, installed.

    With ``hide_history`` (what rollouts use) a cloned repository keeps only the tree of
    ``base_commit`` as a single root commit: no parents, branches, tags or other tasks'
    commits an agent could read the answer from (a built-in task's bug is its base
    commit's own change). Grading keeps the full clone.

    The caller owns the sandbox (delete it when done). On failure the sandbox is deleted and
    PrepareError says which step failed.
    """
    backend = backend or (await client.health()).backend or "local"
    spec = environment_spec(task, backend, default_image)
    sandbox = await client.create_sandbox(
        spec.image,
        block_network=not spec.needs_network,
        labels={"orchard-swe": "1", **(labels or {})},
        timeout=600,
    )
    try:
        if spec.repo_dir == WORKSPACE_REPO:
            await _clone(sandbox, task)
            if hide_history:
                await _run(sandbox, "hiding the repository's history", _SQUASH, WORKSPACE_REPO, 300)
        else:
            await _run(
                sandbox,
                "checking the image's repository",
                f"git -C {spec.repo_dir} rev-parse HEAD",
                "/",
                60,
            )
        config = task.install_config
        for number, command in enumerate(config.pre_install, 1):
            await _run(
                sandbox, f"pre_install step {number}", command, spec.repo_dir, install_timeout
            )
        if config.install:
            await _run(sandbox, "install", config.install, spec.repo_dir, install_timeout)
    except BaseException:
        await sandbox.delete()
        raise
    return sandbox, spec


async def _clone(sandbox: AsyncSandbox, task: Task) -> None:
    bundle = _bundle_bytes(task)
    if bundle is not None:
        await sandbox.upload_content("/tmp/orchard-repo.bundle", bundle)
        source = "/tmp/orchard-repo.bundle"
    else:
        source = task.source_url
    commit = shlex.quote(task.base_commit)
    script = (
        f"git clone -q {shlex.quote(source)} {WORKSPACE_REPO} "
        f"&& cd {WORKSPACE_REPO} && git {_IDENTITY} checkout -q --detach {commit} "
        f"&& git config user.name orchard && git config user.email orchard@localhost "
        f"&& rm -f /tmp/orchard-repo.bundle"
    )
    await _run(sandbox, f"cloning {task.source_url} at {task.base_commit[:12]}", script, "/", 600)

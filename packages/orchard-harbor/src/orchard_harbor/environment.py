"""`OrchardEnvironment`: Harbor's `BaseEnvironment` on an Orchard Env sandbox.

Harbor (PyPI ``harbor``, the Terminal-Bench 2.0 runner) loads it by import path::

    harbor run -p tasks/ -a oracle -e orchard_harbor:OrchardEnvironment \\
        --ek url=http://127.0.0.1:8000

Each trial gets one sandbox, created from the task's ``[environment].docker_image``. A task
with an ``environment/Dockerfile`` is built with the Docker engine when the server's backend
is Docker; on the other backends, whose image store cannot build, the Dockerfile is
replayed in a sandbox of its ``FROM`` image (:mod:`orchard_harbor.dockerfile`). Commands,
files and directories go through the Orchard client (``orchard-env-client``); nothing else
of Orchard is imported.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any, override

from harbor.environments.base import BaseEnvironment, ExecResult, SandboxBuildFailedError
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.definition import environment_content_hash
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode
from pydantic import Field

from orchard_env_client import AsyncSandbox, AsyncSandboxClient, OrchardError

from .dockerfile import CopyStep, ReplayPlan, RunStep, UnsupportedDockerfile, WorkdirStep, plan

DEFAULT_URL = "http://127.0.0.1:8000"
# Harbor passes no timeout for agent commands (they may run long); Orchard needs one.
DEFAULT_EXEC_TIMEOUT_S = 24 * 3600
_SHELL_ONLY_VARS = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})
DOCKERFILE = "Dockerfile"
COMPOSE_FILE = "docker-compose.yaml"
BUILT_IMAGE_REPO = "orchard-harbor"


class OrchardConfigError(ValueError):
    """The provider's configuration or the task's environment cannot be served."""


class OrchardEnvironmentOptions(EnvironmentOptions):
    """Kwargs of ``OrchardEnvironment`` (``--ek key=value`` on Harbor's command line).

    Unset values fall back to the environment: ``url`` to ``$ORCHARD_URL``, then
    ``$ORCHARD_ENV_URL``, then ``http://127.0.0.1:8000``; ``api_key`` to
    ``$ORCHARD_API_KEY``, then ``$ORCHARD_ENV_API_KEY``; ``docker_host`` to ``$DOCKER_HOST``.
    """

    url: str | None = Field(default=None, description="The Orchard Env server's URL.")
    api_key: str | None = Field(default=None, description="An Orchard API key (X-API-Key).")
    image: str | None = Field(
        default=None, description="Use this image instead of the task's docker_image."
    )
    docker_host: str | None = Field(
        default=None,
        description="The Docker engine that builds Dockerfile tasks (the Orchard server's).",
    )
    create_timeout_sec: float = Field(
        default=600.0, description="How long to wait for a sandbox to become ready."
    )
    exec_timeout_sec: float = Field(
        default=DEFAULT_EXEC_TIMEOUT_S,
        description="The kill timer of commands Harbor runs without a timeout of its own.",
    )


def _first(*values: str | None) -> str | None:
    return next((value for value in values if value), None)


class OrchardEnvironment(BaseEnvironment):
    """A Harbor environment whose container is an Orchard Env sandbox.

    Works on every Orchard backend: the server decides where the sandbox runs. Supported:
    tasks naming ``[environment].docker_image`` (an image the server has or may pull),
    and ``environment/Dockerfile`` tasks: built with the ``docker`` CLI against
    ``docker_host`` when the server's backend is ``docker``, otherwise replayed step by
    step in a sandbox of the ``FROM`` image (the Orchard image store imports images but
    does not build them; a Dockerfile a replay cannot reproduce is refused saying
    why). Not supported: ``docker-compose.yaml`` tasks (several services),
    allowlist network policies, GPUs/TPUs, Windows, and running commands as another user
    (every command runs as the sandbox's root).
    """

    options_model = OrchardEnvironmentOptions
    options: OrchardEnvironmentOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = self.options
        self._url = _first(
            options.url, os.environ.get("ORCHARD_URL"), os.environ.get("ORCHARD_ENV_URL")
        )
        self._url = self._url or DEFAULT_URL
        self._api_key = _first(
            options.api_key,
            os.environ.get("ORCHARD_API_KEY"),
            os.environ.get("ORCHARD_ENV_API_KEY"),
        )
        self._docker_host = _first(options.docker_host, os.environ.get("DOCKER_HOST"))
        self._client: AsyncSandboxClient | None = None
        self._sandbox: AsyncSandbox | None = None
        self._warned_user = False
        self._default_cwd = self.task_env_config.workdir
        self._image_env: dict[str, str] = {}  # a replayed Dockerfile's ENV values

    @staticmethod
    @override
    def type() -> str:
        return "orchard"

    @property
    @override
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True)

    @override
    def _validate_definition(self) -> None:
        if (self.environment_dir / COMPOSE_FILE).exists() and not self._image_name():
            raise OrchardConfigError(
                f"{self.environment_dir / COMPOSE_FILE}: docker-compose tasks (several "
                "services) are not supported by the Orchard environment; name one image "
                "in [environment].docker_image or use an environment/Dockerfile"
            )
        if not self._image_name() and not (self.environment_dir / DOCKERFILE).is_file():
            raise FileNotFoundError(
                f"the task names no [environment].docker_image and has no "
                f"{self.environment_dir / DOCKERFILE}"
            )

    def _image_name(self) -> str | None:
        return self.options.image or self.task_env_config.docker_image

    def _require_sandbox(self) -> AsyncSandbox:
        if self._sandbox is None:
            raise RuntimeError("the Orchard sandbox is not running: call start() first")
        return self._sandbox

    async def _build_image(self, force_build: bool) -> str:
        """Build ``environment/Dockerfile`` with the Docker engine of a Docker-backed server."""
        if shutil.which("docker") is None:
            raise OrchardConfigError(
                "building a Dockerfile task needs the docker CLI on this machine, talking to "
                "the Orchard server's engine (set docker_host or $DOCKER_HOST if not local)"
            )
        digest = environment_content_hash(self.environment_dir, truncate=16)
        tag = f"{BUILT_IMAGE_REPO}/{self.environment_name.lower()}:{digest}"
        env = dict(os.environ)
        if self._docker_host:
            env["DOCKER_HOST"] = self._docker_host
        if not force_build:
            found = await asyncio.to_thread(
                subprocess.run,
                ["docker", "image", "inspect", tag],
                capture_output=True,
                env=env,
            )
            if found.returncode == 0:
                return tag
        self.logger.debug(f"Building {tag} from {self.environment_dir}")
        limit = self.task_env_config.build_timeout_sec
        try:
            built = await asyncio.to_thread(
                subprocess.run,
                ["docker", "build", "-t", tag, str(self.environment_dir)],
                capture_output=True,
                text=True,
                env=env,
                timeout=limit,
            )
        except subprocess.TimeoutExpired:
            raise SandboxBuildFailedError(
                f"docker build of {self.environment_dir} took longer than the task's "
                f"build_timeout_sec ({limit:g} s)"
            ) from None
        if built.returncode != 0:
            raise SandboxBuildFailedError(
                f"docker build of {self.environment_dir} failed:\n{built.stderr[-4000:]}"
            )
        return tag

    @override
    async def start(self, force_build: bool) -> None:
        client = AsyncSandboxClient(self._url, api_key=self._api_key, auto_cleanup=False)
        self._client = client
        try:
            image = self._image_name()
            replay = False
            if image is None:
                health = await client.health()
                if health.backend == "docker":
                    image = await self._build_image(force_build)
                else:
                    replay = True
                    image = self._replay_plan().base_image  # refuses early what cannot replay
            memory_mb = self._effective_memory_mb
            cpus = self._effective_cpus
            self._sandbox = await client.create_sandbox(
                image,
                block_network=self._network_blocked,
                cpu=str(cpus) if cpus else None,
                memory=f"{memory_mb}Mi" if memory_mb else None,
                timeout=self.options.create_timeout_sec,
                # a replay's RUN steps see the build's environment, not the runtime one
                env=None if replay else (self._persistent_env or None),
                workdir=None if replay else self.task_env_config.workdir,
            )
            if replay:
                base_env, base_workdir = await self._base_settings(self._sandbox)
                done = self._replay_plan(base_env, base_workdir)
                await self._replay(self._sandbox, done)
                self._image_env = done.env
                self._default_cwd = self.task_env_config.workdir or done.workdir
            await self.ensure_dirs(self._mount_targets(writable_only=True))
            await self._upload_environment_dir_after_start()
        except BaseException:
            await self._close(delete=True)
            raise

    @property
    def _network_blocked(self) -> bool:
        return self._network_policy.network_mode == NetworkMode.NO_NETWORK

    def _replay_plan(
        self, base_env: dict[str, str] | None = None, base_workdir: str = "/"
    ) -> ReplayPlan:
        try:
            return plan(self.environment_dir / DOCKERFILE, None, base_env, base_workdir)
        except UnsupportedDockerfile as exc:
            raise OrchardConfigError(
                f"task {self.environment_name!r}: the Orchard server's image store cannot "
                f"build a Dockerfile, and this one cannot be replayed in a sandbox: {exc}; "
                "build the image elsewhere and name it in docker_image (or pass "
                "--ek image=NAME), or serve Orchard with --backend docker"
            ) from exc

    @staticmethod
    async def _base_settings(sandbox: AsyncSandbox) -> tuple[dict[str, str], str]:
        """The ``FROM`` image's environment and working directory, as its commands see them."""
        job = await sandbox.exec(["/bin/sh", "-c", "pwd; env"], timeout=60)
        if job.exit_code != 0:
            raise SandboxBuildFailedError(
                f"the FROM image has no working /bin/sh to replay RUN steps with: "
                f"{job.stderr or job.error}"
            )
        workdir, *lines = job.stdout.splitlines()
        env: dict[str, str] = {}
        name = ""
        for line in lines:
            key, sep, value = line.partition("=")
            if sep and key.isidentifier():
                name = key
                env[name] = value
            elif name:  # a value with a newline in it
                env[name] += "\n" + line
        return {k: v for k, v in env.items() if k not in _SHELL_ONLY_VARS}, workdir or "/"

    async def _replay(self, sandbox: AsyncSandbox, replay: ReplayPlan) -> None:
        """Perform the Dockerfile's steps in the fresh sandbox (see ``dockerfile``)."""
        timeout = float(self.task_env_config.build_timeout_sec)
        for step in replay.steps:
            if isinstance(step, WorkdirStep):
                await self._checked(sandbox, ["mkdir", "-p", step.path], timeout, "WORKDIR")
            elif isinstance(step, CopyStep):
                await self._replay_copy(sandbox, step, timeout)
            else:
                await self._replay_run(sandbox, step, timeout)
        if replay.user not in (None, "root", "0"):
            self.logger.warning(
                f"the Dockerfile's USER {replay.user} is not applied: commands run as the "
                "FROM image's user"
            )

    async def _replay_run(self, sandbox: AsyncSandbox, step: RunStep, timeout: float) -> None:
        job = await sandbox.exec(step.argv(), cwd=step.cwd, env=step.env or None, timeout=timeout)
        if job.exit_code == 0:
            return
        note = ""
        if self._network_blocked:
            note = (
                " (the task disables the network, and a replay builds in the task's own "
                "sandbox, so RUN steps have none either: name a prebuilt image in "
                "docker_image, or serve Orchard with --backend docker to build it)"
            )
        output = (job.stderr or job.stdout or job.error or "")[-4000:]
        raise SandboxBuildFailedError(
            f"replaying {self.environment_dir / DOCKERFILE}: RUN {step.command} "
            f"exited {job.exit_code}{note}: {output}"
        )

    async def _replay_copy(self, sandbox: AsyncSandbox, step: CopyStep, timeout: float) -> None:
        if step.source.is_dir():
            await self._checked(sandbox, ["mkdir", "-p", step.target], timeout, "COPY")
            with tempfile.TemporaryDirectory(prefix="orchard-copy-") as scratch:
                source = _filtered(step, Path(scratch)) if step.ignore else step.source
                names = sorted(child.name for child in source.iterdir())
                await sandbox.upload_dir(source, step.target)
            copied = [posixpath.join(step.target, name) for name in names]
            mode = step.mode
        else:
            target = step.target
            if step.into_existing_dir:
                probe = await sandbox.exec(["test", "-d", target], timeout=timeout)
                if probe.exit_code == 0:
                    target = posixpath.join(target, step.source.name)
            parent = posixpath.dirname(target) or "/"
            await self._checked(sandbox, ["mkdir", "-p", parent], timeout, "COPY")
            await sandbox.upload_file(step.source, target)
            copied = [target]
            mode = step.mode if step.mode is not None else stat.S_IMODE(step.source.stat().st_mode)
        if not copied:
            return
        if mode is not None:
            await self._checked(sandbox, ["chmod", "-R", f"{mode:o}", *copied], timeout, "COPY")
        if step.owner:
            await self._checked(sandbox, ["chown", "-R", step.owner, *copied], timeout, "COPY")

    @staticmethod
    async def _checked(sandbox: AsyncSandbox, argv: list[str], timeout: float, what: str) -> None:
        job = await sandbox.exec(argv, timeout=timeout)
        if job.exit_code != 0:
            raise SandboxBuildFailedError(f"{what} {argv[-1]}: {job.stderr or job.error}")

    async def _close(self, delete: bool) -> None:
        sandbox, client = self._sandbox, self._client
        self._sandbox = self._client = None
        try:
            if sandbox is not None and delete:
                try:
                    await sandbox.delete()
                except OrchardError as exc:
                    self.logger.error(f"Error deleting sandbox {sandbox.sandbox_id}: {exc}")
        finally:
            if client is not None:
                await client.close()

    @override
    async def stop(self, delete: bool) -> None:
        if self._sandbox is not None and not delete:
            self.logger.info(f"Keeping Orchard sandbox {self._sandbox.sandbox_id}")
        await self._close(delete)

    @override
    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        sandbox = self._require_sandbox()
        user = self._resolve_user(user)
        if user is not None and str(user) not in ("root", "0") and not self._warned_user:
            self._warned_user = True
            self.logger.warning(
                f"the Orchard environment runs every command as the sandbox's root; "
                f"user={user!r} is ignored"
            )
        job = await sandbox.exec(
            command,
            timeout=float(timeout_sec) if timeout_sec else self.options.exec_timeout_sec,
            cwd=cwd or self._default_cwd,
            env={**self._image_env, **(self._merge_env(env) or {})} or None,
        )
        if job.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        stderr = job.stderr or (job.error or "")
        return ExecResult(
            stdout=job.stdout,
            stderr=stderr,
            return_code=job.exit_code if job.exit_code is not None else -1,
        )

    @override
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self._require_sandbox().upload_file(source_path, target_path)

    @override
    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._require_sandbox().upload_dir(source_dir, target_dir)

    @override
    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        await self._require_sandbox().download_file(source_path, target_path)

    @override
    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self._require_sandbox().download_dir(source_dir, target_dir)


def _filtered(step: CopyStep, scratch: Path) -> Path:
    """A copy of the directory ``step.source`` without what its ignore rules leave out
    (an excluded directory is still walked when an ``!`` rule may take files back)."""
    context = step.context or step.source
    out = scratch / "tree"
    rules = step.ignore
    may_take_back = any(exception for exception, _ in rules.rules)

    def ignored(directory: str, names: list[str]) -> set[str]:
        base = Path(directory).relative_to(context)
        return {
            name
            for name in names
            if rules.excludes((base / name).as_posix())
            and not (may_take_back and (Path(directory) / name).is_dir())
        }

    shutil.copytree(step.source, out, symlinks=True, ignore=ignored)
    if may_take_back:  # drop the excluded directories that nothing was taken back into
        for directory, _, _ in sorted(os.walk(out), key=lambda w: -len(w[0])):
            path = Path(directory)
            relative = (step.source / path.relative_to(out)).relative_to(context).as_posix()
            if path != out and rules.excludes(relative) and not any(path.iterdir()):
                path.rmdir()
    return out

"""Sandbox contexts (what a sandbox's commands and files see) and their registry."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .bridges import Bridges
    from .jobs import JobStore
    from .spawner import Spawner

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Mount:
    path: str  # sandbox path, normalised, no trailing slash except "/"
    host_path: str
    writable: bool


@dataclass
class SandboxContext:
    sandbox_id: str
    token: str
    env: dict[str, str]
    workdir: str
    holder_pid: int | None
    mounts: list[Mount]
    # The sandbox's cgroups (local backend): every command moves itself in before it runs.
    cgroup_procs: list[str] = field(default_factory=list)
    # The host (uid, gid) of the sandbox's root (local backend, isolated): the file API
    # acts as them, so what it writes belongs to the sandbox and it can do no more than
    # an unprivileged host user could.
    owner: tuple[int, int] | None = None
    # Who commands run as inside an isolated local sandbox, (uid, gid) there: its image's
    # User. None is the sandbox's root.
    user: tuple[int, int] | None = None
    jobs: JobStore = field(init=False)
    # The command spawner inside an isolated local sandbox (started at registration).
    spawner: Spawner | None = field(default=None, init=False)
    _bridges: Bridges | None = field(default=None, init=False)
    _has_bash: bool | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        from .jobs import JobStore

        self.jobs = JobStore(self.sandbox_id)

    @property
    def bridges(self) -> Bridges:
        """The sandbox's service bridges (none until the orchestrator configures them)."""
        if self._bridges is None:
            from .bridges import Bridges

            self._bridges = Bridges(self.holder_pid)
        return self._bridges

    def stop_commands(self) -> None:
        """Kill the sandbox's running jobs and close its spawner (it is going away)."""
        self.jobs.kill_all()
        if self.spawner is not None:
            self.spawner.close()

    def mount_for(self, sandbox_path: str) -> Mount | None:
        best: Mount | None = None
        for m in self.mounts:
            if (
                sandbox_path == m.path or m.path == "/" or sandbox_path.startswith(m.path + "/")
            ) and (best is None or len(m.path) > len(best.path)):
                best = m
        return best

    def host_path_for(self, sandbox_path: str) -> str | None:
        """Lexical sandbox → host mapping (no symlink checks; for probes only)."""
        m = self.mount_for(sandbox_path)
        if m is None:
            return None
        rest = sandbox_path[len(m.path) :].lstrip("/") if m.path != "/" else sandbox_path[1:]
        return os.path.join(m.host_path, rest) if rest else m.host_path

    @property
    def has_bash(self) -> bool:
        if self._has_bash is None:
            if self.holder_pid is not None:
                probe = f"/proc/{self.holder_pid}/root/bin/bash"
            else:
                probe = self.host_path_for("/bin/bash") or "/bin/bash"
            self._has_bash = os.path.exists(probe)
        return self._has_bash


def normalise_mount_path(path: str) -> str:
    path = os.path.normpath("/" + path.strip("/"))
    return "/" if path in ("/", "//") else path


class Registry:
    def __init__(self, multi: bool) -> None:
        self.multi = multi
        self.sandboxes: dict[str, SandboxContext] = {}

    def add(self, ctx: SandboxContext) -> None:
        old = self.sandboxes.get(ctx.sandbox_id)
        if old is not None:
            ctx.jobs = old.jobs  # re-registration keeps the jobs and the bridges
            ctx._bridges = old._bridges
            same_place = (old.holder_pid, old.cgroup_procs, old.user) == (
                ctx.holder_pid,
                ctx.cgroup_procs,
                ctx.user,
            )
            if same_place:
                ctx.spawner = old.spawner
            elif old.spawner is not None:
                old.spawner.close()
        self.sandboxes[ctx.sandbox_id] = ctx

    def get(self, sandbox_id: str) -> SandboxContext | None:
        return self.sandboxes.get(sandbox_id)

    def remove(self, sandbox_id: str) -> SandboxContext | None:
        return self.sandboxes.pop(sandbox_id, None)

    def only(self) -> SandboxContext:
        return next(iter(self.sandboxes.values()))


DEFAULT_WORKDIR = "/workspace"


def _image_workdir() -> str:
    """The agent's cwd (the image's WORKDIR); for an image with none, ``/workspace``.

    That is where the public Orchard Env service runs every command, so its users' code
    (``cwd="/workspace"``, relative paths) works on images such as ``python:3.11-slim``.
    Made if missing; ``/`` when it cannot be (a non-root image user).
    """
    cwd = os.getcwd()
    if cwd != "/":
        return cwd
    try:
        os.makedirs(DEFAULT_WORKDIR, exist_ok=True)
    except OSError:
        return cwd
    return DEFAULT_WORKDIR


def single_context(sandbox_id: str, token: str) -> SandboxContext:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ORCHARD_AGENT_TOKEN", "ORCHARD_AGENT_TOKEN_FILE", "ORCHARD_AGENT_ADMIN_TOKEN")
    }
    env.setdefault("PATH", DEFAULT_PATH)
    workdir = os.environ.get("ORCHARD_WORKDIR") or _image_workdir()
    return SandboxContext(
        sandbox_id=sandbox_id,
        token=token,
        env=env,
        workdir=workdir,
        holder_pid=None,
        mounts=[Mount("/", "/", True)],
    )

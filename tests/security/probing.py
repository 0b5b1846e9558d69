"""Helpers of the escape suite: probes that run inside a sandbox, and what the host checks.

A probe is a Python program run with the sandbox's own ``python3`` (every test image has
one; system calls go through ctypes, so a missing tool never turns an attempt into a
skip). It prints a marker before it tries anything and a JSON line of results at the end:
``run_probe`` fails unless both are there, so "refused" always means "tried and failed".
Results name the outcome of each attempt: ``"ok"`` when it worked, else the errno's name.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import attrs
import psutil

PROBE_RAN = "ORCHARD-PROBE-RAN"
PROBE_RESULT = "ORCHARD-PROBE-RESULT "

# Arguments travel hex-encoded, so that no secret the probe looks for is ever written in
# plain text anywhere (say, in a job record) where a search of the sandbox could meet it.
PRELUDE = f"""
import ctypes, errno, json, os, sys, time
print({PROBE_RAN!r}, flush=True)
ARGS = json.loads(bytes.fromhex(sys.argv[1]).decode())
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {{}}

def errname(code):
    return errno.errorcode.get(code, str(code)) if code else "failed"

def call(fn, *args):
    \"\"\"'ok' when a libc call returned anything but -1, else its errno's name.\"\"\"
    ctypes.set_errno(0)
    result = fn(*args)
    return "ok" if result != -1 else errname(ctypes.get_errno())

def attempt(fn, *args, **kwargs):
    \"\"\"'ok' when a Python call raised no OSError, else the error's errno name.\"\"\"
    try:
        fn(*args, **kwargs)
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return errname(exc.errno)
    return "ok"
"""
EPILOGUE = f"\nprint({PROBE_RESULT!r} + json.dumps(out), flush=True)\n"


def probe_command(body: str, **args: Any) -> list[str]:
    """The argv running ``body`` (Python, with the prelude's helpers and ``ARGS``)."""
    program = PRELUDE + textwrap.dedent(body) + EPILOGUE
    return ["python3", "-c", program, json.dumps(args).encode().hex()]


def probe_result(job: Any) -> dict[str, Any]:
    """A finished probe's ``out`` dict; fails unless the probe both started and finished."""
    assert PROBE_RAN in job.stdout, (
        f"the probe never ran: exit {job.exit_code} {job.error or ''}\n{job.stderr}"
    )
    for line in reversed(job.stdout.splitlines()):
        if line.startswith(PROBE_RESULT):
            return dict(json.loads(line[len(PROBE_RESULT) :]))
    raise AssertionError(
        f"the probe did not finish: exit {job.exit_code} {job.error or ''}\n"
        f"{job.stdout[-2000:]}\n{job.stderr[-2000:]}"
    )


def run_probe(sandbox: Any, body: str, *, timeout: float = 60, **args: Any) -> dict[str, Any]:
    """Run a probe inside ``sandbox`` and return its ``out`` dict."""
    return probe_result(sandbox.exec(probe_command(body, **args), timeout=timeout))


def succeeded(results: dict[str, Any]) -> dict[str, Any]:
    """The attempts among ``results`` that worked (an empty dict when all were refused)."""
    return {what: outcome for what, outcome in results.items() if outcome == "ok"}


def unique(prefix: str = "orchard-escape") -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


def sleep_marker() -> str:
    """A ``sleep`` argument no other process has: about 70 minutes and a random fraction."""
    return f"4321.{secrets.randbelow(10**9):09d}"


# ---- host processes ----------------------------------------------------------------------


def host_sleeps(marker: str) -> list[int]:
    """Host pids of the ``sleep MARKER`` processes (not of the shells that started them)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if os.path.basename(argv[0]) == b"sleep" and argv[1:2] == [marker.encode()]:
                found.append(int(entry))
    return found


def wait_for_host_pid(marker: str, seconds: float = 30) -> int:
    deadline = time.monotonic() + seconds
    while not (pids := host_sleeps(marker)):
        assert time.monotonic() < deadline, f"no host process runs sleep {marker}"
        time.sleep(0.1)
    return pids[0]


def untouched(pid: int) -> bool:
    """Whether a host process runs on neither stopped nor traced."""
    fields = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return fields["State"][0] not in "tTXZ" and fields["TracerPid"].strip() == "0"


# Looks for a process by its command line, then tries to signal (0: nothing is sent),
# trace (detached at once if that ever worked), open the memory of and list the root of
# each given pid, unless that pid is, inside, one of the sandbox's own other processes.
PROCESS_PROBE = """
PTRACE_ATTACH, PTRACE_DETACH, WALL = 16, 17, 0x40000000
marker = ARGS["marker"].encode()
out["seen"] = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            if marker in open(f"/proc/{pid}/cmdline", "rb").read():
                out["seen"].append(pid)
        except OSError:
            pass
out["tries"] = {}
for pid in ARGS["pids"]:
    try:
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        cmdline = None
    if cmdline is not None and marker not in cmdline:
        out["tries"][str(pid)] = {"skipped": "the sandbox's own process: " + cmdline[:60].decode(errors="replace")}
        continue
    tried = out["tries"][str(pid)] = {}
    tried["signal 0"] = attempt(os.kill, pid, 0)
    tried["ptrace"] = call(libc.ptrace, PTRACE_ATTACH, pid, None, None)
    if tried["ptrace"] == "ok":
        os.waitpid(pid, WALL)
        libc.ptrace(PTRACE_DETACH, pid, None, None)
    tried["mem"] = attempt(lambda: os.close(os.open(f"/proc/{pid}/mem", os.O_RDONLY)))
    tried["root"] = attempt(os.listdir, f"/proc/{pid}/root/")
"""


def assert_unreached(result: dict[str, Any], pid: int) -> None:
    """A process probed by PROCESS_PROBE was neither seen nor touched from the sandbox."""
    assert result["seen"] == [], f"the process is visible inside: {result}"
    reached = {p: succeeded(t) for p, t in result["tries"].items() if succeeded(t)}
    assert reached == {}, result
    assert untouched(pid), "the process was stopped, traced or ended"


# ---- host files --------------------------------------------------------------------------


@attrs.define
class HostSecret:
    """A file planted on the host for a sandbox to fail to read: unique name and content."""

    path: Path
    content: str


SECRET_ROOTS = ("/root", "/srv", "/var/tmp", "/home")


@contextmanager
def planted_secrets(*extra_roots: Path) -> Iterator[list[HostSecret]]:
    """One private (0600 in a 0700 dir) secret under each existing root; removed after."""
    roots = [Path(r) for r in SECRET_ROOTS] + [Path(tempfile.gettempdir()), *extra_roots]
    made: list[Path] = []
    planted = []
    try:
        for root in roots:
            if not root.is_dir():
                continue
            folder = root / unique()
            folder.mkdir(mode=0o700)
            made.append(folder)
            path = folder / unique("secret")
            path.write_text(unique("orchard-host-secret"))
            path.chmod(0o600)
            planted.append(HostSecret(path, path.read_text()))
        yield planted
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


def find_on_host(name: str, roots: list[Path], seconds: float = 60) -> list[str]:
    """Host paths named ``name`` below ``roots`` (bounded by ``seconds``)."""
    existing = [str(r) for r in roots if r.exists()]
    if not existing:
        return []
    done = subprocess.run(
        ["timeout", str(seconds), "find", *existing, "-name", name], capture_output=True, text=True
    )
    return done.stdout.split()


def removed_if_present(paths: list[Path]) -> list[str]:
    """Delete whichever of ``paths`` exist (an escape left them) and name them."""
    present = [p for p in paths if p.exists() or p.is_symlink()]
    for path in present:
        path.unlink()
    return [str(p) for p in present]


# ---- host network ------------------------------------------------------------------------


class MarkerService:
    """A TCP service on the host that greets each connection with a marker and records it.

    It serves from a daemon thread, never longer than ``seconds``, and stops on exit."""

    def __init__(self, host: str = "127.0.0.1", seconds: float = 300) -> None:
        self.marker = unique("orchard-host-service")
        self.accepted: list[str] = []
        self._stop = threading.Event()
        self._deadline = time.monotonic() + seconds
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            try:
                conn, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(f"{peer[0]}:{peer[1]} ({_who_connected(peer)})")
            with conn:
                conn.settimeout(1)
                with suppress(OSError):
                    conn.sendall(self.marker.encode())

    def __enter__(self) -> MarkerService:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()


def _who_connected(peer: tuple[str, int]) -> str:
    """The host process whose socket is ``peer`` (a failure then names who reached the
    service: a sandbox's helper, or some host client that happened on its port)."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and (conn.laddr.ip, conn.laddr.port) == peer[:2]:
            if conn.pid is None:
                return "no process of this host's pid namespace"
            with suppress(psutil.Error):
                return f"pid {conn.pid}: {' '.join(psutil.Process(conn.pid).cmdline())[:200]}"
            return f"pid {conn.pid}"
    return "no local socket"


# Tries each (host, port) with a short timeout; also the sandbox's default gateway and
# slirp's alias of the host (10.0.2.2), on every given port.
CONNECT_PROBE = """
import socket, struct
targets = [tuple(t) for t in ARGS["targets"]]
gateways = ["10.0.2.2"]
try:
    for line in open("/proc/net/route").read().splitlines()[1:]:
        fields = line.split()
        if fields[1] == "00000000" and fields[2] != "00000000":
            gateways.append(socket.inet_ntoa(struct.pack("<I", int(fields[2], 16))))
except OSError:
    pass
out["gateways"] = gateways
for port in ARGS["ports"]:
    targets += [(gateway, port) for gateway in gateways]
connections = {}
for host, port in targets:
    sock = socket.socket()
    sock.settimeout(2)
    try:
        sock.connect((host, port))
        try:
            connections[f"{host}:{port}"] = "ok: " + sock.recv(128).decode(errors="replace")
        except OSError:
            connections[f"{host}:{port}"] = "ok: connected, nothing said"
    except TimeoutError:
        connections[f"{host}:{port}"] = "timeout"
    except OSError as exc:
        connections[f"{host}:{port}"] = errname(exc.errno)
    finally:
        sock.close()
out["connections"] = connections
"""


def connections_made(result: dict[str, Any]) -> dict[str, str]:
    """The connections of a ``CONNECT_PROBE`` that reached something."""
    return {t: r for t, r in result["connections"].items() if r.startswith("ok")}


# ---- host cgroups ------------------------------------------------------------------------


def pids_limit_of(pid: int) -> tuple[Path, int]:
    """The host cgroup directory that holds a process's effective pids limit, and that limit
    (the lowest ``pids.max`` from its own cgroup up to the root; cgroup v1 or v2)."""
    mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    v1 = next((m[1] for m in mounts if m[2] == "cgroup" and "pids" in m[3].split(",")), None)
    v2 = next((m[1] for m in mounts if m[2] == "cgroup2"), None)
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if v1 and "pids" in controllers.split(","):
            root = Path(v1)
            break
        if not v1 and v2 and controllers == "":
            root = Path(v2)
            break
    else:
        raise AssertionError(f"no pids cgroup for pid {pid}")
    best: tuple[Path, int] | None = None
    here = root / path.lstrip("/")
    while True:
        limit_file = here / "pids.max"
        if limit_file.exists():
            text = limit_file.read_text().strip()
            if text != "max" and (best is None or int(text) < best[1]):
                best = (here, int(text))
        if here == root:
            break
        here = here.parent
    assert best is not None, f"no pids limit holds pid {pid} (cgroup {path})"
    return best

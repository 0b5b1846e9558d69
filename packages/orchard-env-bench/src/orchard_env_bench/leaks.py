"""What a local-backend orchestrator left behind after deleting its sandboxes.

Counted from the outside, for a server the bench started itself (its pid and state dir
known): nothing here asks the server. Five kinds:

- ``processes``: the orchestrator's descendants (zombies included) that were not there
  before the first create, plus any process still in a sandbox cgroup of this state dir;
- ``cgroup_dirs``: sandbox cgroups under this state dir's parent cgroup(s) (the server's
  own naming, ``local.cgroups.Cgroups``);
- ``mounts``: lines of ``/proc/self/mountinfo`` and the orchestrator's mountinfo that name
  the state dir (a sandbox's root overlay, binds);
- ``sandbox_dirs``: entries of ``<state>/sandboxes``;
- ``uid_claims``: claims in the machine-wide uid range registry naming this state dir.

Deletion may finish in the background (reaping after the client's delete returned), so
:func:`settle` counts once at once and then again until all are zero or a deadline passes.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import psutil

LEAK_KINDS = ("processes", "cgroup_dirs", "mounts", "sandbox_dirs", "uid_claims")
UID_REGISTRY = Path("/run/orchard-env/uid-ranges")  # the server's default (Settings)


def descendants(pid: int) -> set[int]:
    """Pids of every process under ``pid`` (none if it is gone)."""
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def _sandbox_cgroups(state_dir: Path) -> list[Path]:
    from orchard_env_server.backends.local.cgroups import Cgroups

    groups = Cgroups(state_dir.resolve())
    parents = groups._parents()  # the server's own layout, v1 or v2
    found: list[Path] = []
    for parent in parents:
        with contextlib.suppress(OSError):
            found += [p for p in parent.iterdir() if p.is_dir()]
    return found


def _cgroup_processes(dirs: list[Path]) -> set[int]:
    pids: set[int] = set()
    for d in dirs:
        with contextlib.suppress(OSError, ValueError):
            pids |= {int(line) for line in (d / "cgroup.procs").read_text().split()}
    return pids


def _mounts(state_dir: Path, pids: list[int]) -> int:
    needle = str(state_dir.resolve())
    lines: set[str] = set()
    for where in ("self", *map(str, pids)):
        with contextlib.suppress(OSError):
            text = Path(f"/proc/{where}/mountinfo").read_text()
            # mount ids differ between namespaces: key on what is mounted where
            lines |= {" ".join(ln.split()[3:5]) for ln in text.splitlines() if needle in ln}
    return len(lines)


def _uid_claims(state_dir: Path, registry: Path) -> int:
    needle = str(state_dir.resolve())
    count = 0
    with contextlib.suppress(OSError):
        for claim in registry.iterdir():
            with contextlib.suppress(OSError):
                if claim.name != ".lock" and claim.read_text().startswith(needle):
                    count += 1
    return count


def count_leaks(
    state_dir: Path, server_pid: int, before: set[int], registry: Path = UID_REGISTRY
) -> dict[str, int]:
    """Counts of each kind in :data:`LEAK_KINDS`; ``before`` are the orchestrator's
    descendants before the first create (its agent), which are not leaks."""
    groups = _sandbox_cgroups(state_dir)
    procs = (descendants(server_pid) - before) | _cgroup_processes(groups)
    sandboxes = state_dir / "sandboxes"
    try:
        dirs = sum(1 for _ in sandboxes.iterdir())
    except OSError:
        dirs = 0
    return {
        "processes": len(procs),
        "cgroup_dirs": len(groups),
        "mounts": _mounts(state_dir, [server_pid]),
        "sandbox_dirs": dirs,
        "uid_claims": _uid_claims(state_dir, registry),
    }


def settle(
    state_dir: Path, server_pid: int, before: set[int], timeout_s: float = 30.0
) -> dict[str, object]:
    """Leaks right after the deletes returned, and once background reaping is done (or
    ``timeout_s`` passed): ``{"at_delete": {...}, "after": {...}, "settle_s": float}``."""
    started = time.perf_counter()
    first = count_leaks(state_dir, server_pid, before)
    now = first
    while any(now.values()) and time.perf_counter() - started < timeout_s:
        time.sleep(0.1)
        now = count_leaks(state_dir, server_pid, before)
    return {"at_delete": first, "after": now, "settle_s": time.perf_counter() - started}

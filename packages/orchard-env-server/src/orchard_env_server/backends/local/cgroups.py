"""Per-sandbox cgroups for the local backend: a pids, memory and CPU limit each.

Namespaces isolate what a local sandbox sees, not what it uses: without a cgroup one fork
bomb or memory hog takes the whole machine. Each sandbox gets its own cgroup (v1: one
directory per controller; v2: one directory), its holder is moved in at create, and every
command the agent starts moves itself in before it executes (the agent is told the
``cgroup.procs`` files). Needs root (or a delegated subtree); without it the backend runs
unlimited and says so, like it does without bubblewrap.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import time
from pathlib import Path

import attrs

CGROUP_ROOT = Path("/sys/fs/cgroup")
_V1_CONTROLLERS = ("pids", "memory", "cpu")
_CFS_PERIOD_US = 100_000


def _quota_us(cpus: float) -> int:
    """CFS quota per period for ``cpus`` cores; the kernel refuses less than 1 ms."""
    return max(1000, int(cpus * _CFS_PERIOD_US))


@attrs.define(frozen=True)
class Limits:
    """What one sandbox may use; None means no limit of that kind."""

    pids: int | None
    memory_bytes: int | None
    cpus: float | None


class Cgroups:
    """Creates and removes the cgroups of this orchestrator's local sandboxes."""

    def __init__(self, state_dir: Path, root: Path = CGROUP_ROOT) -> None:
        # One parent per state dir, so that two orchestrators on one machine never meet.
        self._name = "orchard-" + hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]
        self._root = root
        self.v2 = (root / "cgroup.controllers").exists()
        self.usable, self.why_not = False, "not probed"

    # -- setup ---------------------------------------------------------------------
    def probe(self) -> tuple[bool, str]:
        """Make the parent cgroup(s); whether per-sandbox limits work here, and why not."""
        try:
            if self.v2:
                wanted = {"pids", "memory", "cpu"}
                have = set((self._root / "cgroup.controllers").read_text().split())
                if not {"pids", "memory"} <= have:
                    raise OSError(errno.ENOTSUP, f"cgroup v2 lacks controllers: {have}")
                parent = self._root / self._name
                parent.mkdir(exist_ok=True)
                enable = " ".join(f"+{c}" for c in sorted(wanted & have))
                (self._root / "cgroup.subtree_control").write_text(enable)
                (parent / "cgroup.subtree_control").write_text(enable)
            else:
                for controller in ("pids", "memory"):
                    if not (self._root / controller).is_dir():
                        raise OSError(errno.ENOTSUP, f"no cgroup v1 {controller} controller")
                for controller in self._v1_controllers():
                    (self._root / controller / self._name).mkdir(exist_ok=True)
        except OSError as exc:
            self.usable, self.why_not = False, f"cannot create cgroups: {exc}"
        else:
            self.usable, self.why_not = True, ""
        return self.usable, self.why_not

    def _v1_controllers(self) -> list[str]:
        return [c for c in _V1_CONTROLLERS if (self._root / c).is_dir()]

    def _dirs(self, sandbox_id: str) -> list[Path]:
        if self.v2:
            return [self._root / self._name / sandbox_id]
        return [self._root / c / self._name / sandbox_id for c in self._v1_controllers()]

    # -- per sandbox -----------------------------------------------------------------
    def create(self, sandbox_id: str, limits: Limits) -> list[str]:
        """Make the sandbox's cgroup(s) with ``limits``; returns their ``cgroup.procs``."""
        dirs = self._dirs(sandbox_id)
        try:
            for d in dirs:
                d.mkdir(exist_ok=True)
                self._apply(d, limits)
        except OSError:
            self.remove(sandbox_id)
            raise
        return [str(d / "cgroup.procs") for d in dirs]

    def _apply(self, d: Path, limits: Limits) -> None:
        def write(name: str, value: str) -> None:
            if (d / name).exists():
                (d / name).write_text(value)

        if self.v2:
            if limits.pids is not None:
                write("pids.max", str(limits.pids))
            if limits.memory_bytes is not None:
                write("memory.max", str(limits.memory_bytes))
                write("memory.swap.max", "0")
            if limits.cpus is not None:
                write("cpu.max", f"{_quota_us(limits.cpus)} {_CFS_PERIOD_US}")
            return
        controller = d.parent.parent.name
        if controller == "pids" and limits.pids is not None:
            write("pids.max", str(limits.pids))
        elif controller == "memory" and limits.memory_bytes is not None:
            write("memory.limit_in_bytes", str(limits.memory_bytes))
            with contextlib.suppress(OSError):  # no swap accounting: nothing to cap
                write("memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        elif controller == "cpu" and limits.cpus is not None:
            write("cpu.cfs_period_us", str(_CFS_PERIOD_US))
            write("cpu.cfs_quota_us", str(_quota_us(limits.cpus)))

    def attach(self, procs_files: list[str], pid: int) -> None:
        """Move process ``pid`` (and so its future children) into the sandbox's cgroups."""
        for path in procs_files:
            with open(path, "w") as fh:
                fh.write(str(pid))

    def remove(self, sandbox_id: str, wait_s: float = 2.0) -> None:
        """Remove the sandbox's cgroups once their processes are gone (they are being killed)."""
        deadline = time.monotonic() + wait_s
        for d in self._dirs(sandbox_id):
            while d.exists():
                try:
                    d.rmdir()
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        break
                    time.sleep(0.01)

    def _parents(self) -> list[Path]:
        if self.v2:
            return [self._root / self._name]
        return [self._root / c / self._name for c in self._v1_controllers()]

    def close(self) -> None:
        """Remove the parent cgroup(s) once no sandbox cgroup is left in them."""
        for parent in self._parents():
            with contextlib.suppress(OSError):
                parent.rmdir()

    def leftovers(self, known: set[str]) -> list[str]:
        """Sandbox cgroups of this state dir whose sandbox is not in ``known``."""
        found: set[str] = set()
        for parent in self._parents():
            with contextlib.suppress(OSError):
                found |= {p.name for p in parent.iterdir() if p.is_dir()}
        return sorted(found - known)

"""Host uid ranges for local sandboxes: each sandbox's root is a different unprivileged uid.

A sandbox's user namespace maps its uids 0..65535 onto a range of host uids no account
uses, one range per sandbox, so that nothing a sandbox writes or owns belongs to the host's
root or to another sandbox. Ranges are claimed machine-wide (several orchestrators, with
different state dirs, may run on one host) by a claim file under a lock (flock) in a
shared directory; a claim names the sandbox's directory and is stale once that directory
is gone, which lets a crashed orchestrator's ranges be reused.
"""

from __future__ import annotations

import contextlib
import fcntl
import threading
from collections.abc import Iterator
from pathlib import Path

RANGE_SIZE = 65536
FIRST_UID = 1_000_000_000  # far above any account or /etc/subuid range in common use
SLOTS = (2**32 - 2 - FIRST_UID) // RANGE_SIZE


class NoFreeRange(RuntimeError):
    """Every uid range is claimed by a live sandbox."""


class UidRanges:
    """Claims and releases ranges in ``registry`` (a directory only root may write)."""

    def __init__(self, registry: Path) -> None:
        self._registry = registry
        self._next = 0
        self._lock = threading.Lock()

    def prepare(self) -> None:
        self._registry.mkdir(mode=0o700, parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """This process's threads and other orchestrators, one at a time."""
        with self._lock, open(self._registry / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def claim(self, owner: Path) -> int:
        """The first uid of a range now claimed for the sandbox directory ``owner``."""
        with self._locked():
            start = self._next
            for i in range(SLOTS):
                slot = (start + i) % SLOTS
                if self._try(slot, owner):
                    self._next = (slot + 1) % SLOTS
                    return FIRST_UID + slot * RANGE_SIZE
        raise NoFreeRange(f"all {SLOTS} sandbox uid ranges are in use")

    def keep(self, first_uid: int, owner: Path) -> bool:
        """Re-assert an adopted sandbox's claim (written anew if it was lost or stale);
        False when another live sandbox holds it now."""
        claim = self._claim_file(_slot_of(first_uid))
        with self._locked():
            with contextlib.suppress(OSError):
                holder = claim.read_text()
                if holder == str(owner):
                    return True
                if Path(holder).exists():
                    return False
            claim.write_text(str(owner))
            return True

    def release(self, first_uid: int, owner: Path) -> None:
        claim = self._claim_file(_slot_of(first_uid))
        with self._locked(), contextlib.suppress(OSError):
            if claim.read_text() == str(owner):
                claim.unlink()

    def _claim_file(self, slot: int) -> Path:
        return self._registry / str(slot)

    def _try(self, slot: int, owner: Path) -> bool:
        claim = self._claim_file(slot)
        try:
            holder = Path(claim.read_text())
        except FileNotFoundError:
            pass
        else:
            if holder.exists():
                return False
            claim.unlink()  # stale: its sandbox directory is gone
        claim.write_text(str(owner))
        return True


def _slot_of(first_uid: int) -> int:
    return (first_uid - FIRST_UID) // RANGE_SIZE

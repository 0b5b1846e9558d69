"""A fingerprint of the agent's own code, so an orchestrator can tell an agent it adopted
from before an upgrade (same version string, other code) from one of its own install."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_SUFFIXES = {".py", ".c"}


@functools.cache
def build_id() -> str:
    """16 hex digits over every source file of the installed package (paths and bytes).

    Computed once per process: an agent reports the code it started with, the caller
    compares it with ``build_id()`` of the code installed now.
    """
    digest = hashlib.sha256()
    for path in sorted(p for p in _PACKAGE.rglob("*") if p.suffix in _SUFFIXES):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]

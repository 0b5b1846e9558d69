"""Process limits the agent and the orchestrator raise for themselves at start."""

from __future__ import annotations

import contextlib
import resource


def raise_open_file_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: every running command holds three pipes,
    every busy client a connection; the usual soft default of 1024 is too few at scale."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

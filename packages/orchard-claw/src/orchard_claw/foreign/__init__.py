"""Foreign harnesses: third-party agent CLIs run *inside* the sandbox against our model.

Each adapter is pure: from a :class:`HarnessRun` (model, the model's base URL as seen
inside the sandbox, the task, workdir and a scratch home) it gives an :class:`Invocation`
(files, argv, env, cwd, time limit), and from the harness's stdout and exit code a
:class:`ForeignResult`; :mod:`orchard_claw.foreign_runner` runs it. The binaries live in the
``orchard-test/harnesses`` image. How to add a harness: ``docs/claw.md`` ("Adding a
harness").
"""

from __future__ import annotations

from . import codex, openclaw, opencode
from .base import (
    API_KEY_ENV,
    DUMMY_API_KEY,
    HARNESS_PATH,
    ForeignHarness,
    ForeignResult,
    HarnessRun,
    Invocation,
)

__all__ = [
    "API_KEY_ENV",
    "DUMMY_API_KEY",
    "HARNESSES",
    "HARNESS_IMAGE",
    "HARNESS_PATH",
    "HARNESS_ROOTFS",
    "ForeignHarness",
    "ForeignResult",
    "HarnessRun",
    "Invocation",
]

HARNESS_IMAGE = "orchard-test/harnesses"
"""The Docker/Kubernetes image holding node and every harness below."""
HARNESS_ROOTFS = "/var/tmp/orchard-images/harnesses-rootfs"
"""The same tree as a root filesystem directory: the local backend's ``image``."""

HARNESSES: dict[str, ForeignHarness] = {
    h.name: h for h in (openclaw.HARNESS, codex.HARNESS, opencode.HARNESS)
}
"""Every foreign harness by name."""

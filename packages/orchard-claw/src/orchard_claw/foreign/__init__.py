"""Foreign harnesses: third-party agent CLIs run *inside* the sandbox against our model.

Each adapter is pure: from a :class:`HarnessRun` (model name, the model's base URL as seen
inside the sandbox — ``http://127.0.0.1:<bridge port>/r/<run>/v1``, a service bridge to
the recording proxy —, the task text, the workdir and a scratch home) it gives an
:class:`Invocation` (files to write, argv, env, cwd, time limit), and from the harness's
stdout and exit code a :class:`ForeignResult` (final answer, exit status, turns, tool calls,
tokens). Running it is the caller's business (:mod:`orchard_claw.foreign_runner`)::

    harness = HARNESSES["codex"]
    inv = harness.invocation(HarnessRun(model=m, base_url=url, task=text))
    for path, content in inv.files.items():
        sandbox.upload_content(path, content)
    job = sandbox.exec(inv.argv, env=dict(inv.env), cwd=inv.cwd, stdin=inv.stdin,
                       timeout=inv.exec_timeout_s)
    result = harness.parse(job.stdout, job.exit_code)

The binaries live in the ``orchard-test/harnesses`` image (``infra/images/build``; the same
tree as a rootfs directory for the local backend, ``/var/tmp/orchard-images/harnesses-rootfs``).

Adding a harness (e.g. ZeroClaw, where its binary is available):

1. Put its binary in the image: add the npm package to ``HARNESS_PACKAGES`` in
   ``infra/images/build`` (or copy a static binary into ``/opt/harnesses/bin`` there) and to
   ``HARNESS_BINS``; rebuild.
2. Find how it runs without a terminal: a one-shot subcommand, a JSON (lines) output mode,
   stdin from /dev/null, no approval prompts, and how it is pointed at an
   OpenAI-compatible base URL (config file or env) — keep its config and state under
   ``run.home``, never in the workdir.
3. Write ``foreign/<name>.py`` with ``build(run) -> Invocation`` (use :func:`base_env` and
   :func:`with_time_limit`) and ``parse(stdout, exit_code) -> ForeignResult`` (use
   :func:`json_lines`, :func:`exit_status_of`), and a module-level ``HARNESS``; add it to
   :data:`HARNESSES` below.
4. Record what it requests (endpoint, streaming, tool names and schemas) in the module
   docstring, so a scripted model can drive it, and add it to
   ``tests/test_foreign_harnesses.py`` (a real run in the image against the in-sandbox
   stub model).
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

"""The jobs this orchestrator started and has not yet seen finish.

Jobs live in the sandbox's agent. When the agent goes away in the middle of one (killed,
OOM, its container removed, the sandbox reaped), the agent can no longer say how the job
ended; the ledger lets the orchestrator answer for it instead: the job ``failed``, with
the reason, rather than a bare 404 or a connection error. The orchestrator picks every
job id itself (``<sandbox id>.<16 hex>``, passed to the agent), so even a ``wait: true``
exec whose agent dies before answering has an id to report.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from typing import Any

import attrs

MAX_OPEN_PER_SANDBOX = 10_000  # background jobs nobody ever asked about again
MAX_LOST = 10_000  # answers kept for jobs declared lost, so that asking again agrees


@attrs.define
class OpenJob:
    job_id: str
    sandbox_id: str
    tenant: str
    command: str | list[str]
    created_at: float = attrs.Factory(time.time)


def _done(job: Any) -> bool:
    return isinstance(job, dict) and job.get("status") in ("succeeded", "failed")


class JobLedger:
    """Open jobs per sandbox, oldest dropped beyond ``MAX_OPEN_PER_SANDBOX``."""

    def __init__(self) -> None:
        self._open: dict[str, OrderedDict[str, OpenJob]] = {}
        self._lost: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lost_tenant: dict[str, str] = {}

    def open(self, sandbox_id: str, tenant: str, command: str | list[str]) -> str:
        """Mint a job id for a command about to be sent to the sandbox's agent."""
        job_id = f"{sandbox_id}.{secrets.token_hex(8)}"
        jobs = self._open.setdefault(sandbox_id, OrderedDict())
        jobs[job_id] = OpenJob(job_id, sandbox_id, tenant, command)
        while len(jobs) > MAX_OPEN_PER_SANDBOX:
            jobs.popitem(last=False)
        return job_id

    def get(self, job_id: str) -> OpenJob | None:
        jobs = self._open.get(job_id.partition(".")[0])
        return None if jobs is None else jobs.get(job_id)

    def observe(self, job: Any) -> Any:
        """Pass an agent's job answer through; a finished job leaves the ledger."""
        if _done(job):
            self._close(str(job.get("job_id", "")))
        return job

    def discard(self, job_id: str) -> None:
        """The job ended normally (or never started): nothing to answer for."""
        self._close(job_id)

    def lost(self, job_id: str, reason: str, tenant: str | None = None) -> dict[str, Any] | None:
        """The job object of an open job whose agent can no longer answer: ``failed``.

        None for a job the ledger never had open (and was not declared lost before), and
        for another tenant's job when ``tenant`` is given.
        """
        if job_id in self._lost:
            if tenant is not None and self._lost_tenant.get(job_id) != tenant:
                return None
            return self._lost[job_id]
        open_job = self.get(job_id)
        if open_job is not None and tenant is not None and open_job.tenant != tenant:
            return None
        job = self._close(job_id)
        if job is None:
            return None
        answer = {
            "job_id": job.job_id,
            "sandbox_id": job.sandbox_id,
            "command": job.command,
            "status": "failed",
            "stdout": "",
            "stderr": "",
            "exit_code": None,
            "created_at": job.created_at,
            "started_at": None,
            "completed_at": time.time(),
            "error": f"lost: {reason}; its output is gone",
            "timed_out": False,
            "stdout_truncated": False,
            "stderr_truncated": False,
            "usage": None,
        }
        self._lost[job_id] = answer
        self._lost_tenant[job_id] = job.tenant
        while len(self._lost) > MAX_LOST:
            oldest, _ = self._lost.popitem(last=False)
            self._lost_tenant.pop(oldest, None)
        return answer

    def declared_lost(self, job_id: str, tenant: str) -> dict[str, Any] | None:
        """The answer given earlier for the tenant's job declared lost, if any."""
        if self._lost_tenant.get(job_id) != tenant:
            return None
        return self._lost.get(job_id)

    def lose_sandbox(self, sandbox_id: str, reason: str) -> None:
        """The sandbox is gone: every job still open in it is lost for ``reason``."""
        for job_id in list(self._open.get(sandbox_id, {})):
            self.lost(job_id, reason)

    def open_count(self, sandbox_id: str) -> int:
        return len(self._open.get(sandbox_id, {}))

    def _close(self, job_id: str) -> OpenJob | None:
        sandbox_id = job_id.partition(".")[0]
        jobs = self._open.get(sandbox_id)
        if jobs is None:
            return None
        job = jobs.pop(job_id, None)
        if not jobs:
            self._open.pop(sandbox_id, None)
        return job

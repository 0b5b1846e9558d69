"""Job objects (the public job shape) and the per-sandbox job store."""

from __future__ import annotations

import asyncio
import codecs
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError
from .output import CappedBuffer
from .process import Running

MAX_FINISHED = 1000  # finished jobs kept per sandbox, results and all
MAX_EVICTED = 10_000  # ids of finished jobs dropped since, so a late ask hears why


@dataclass
class Job:
    job_id: str
    sandbox_id: str
    command: str | list[str]
    cap: int
    status: str = "queued"
    exit_code: int | None = None
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    completed_at: float | None = None
    error: str | None = None
    timed_out: bool = False
    cancelled: bool = False
    usage: dict[str, Any] | None = None
    proc: Running | None = None
    stdout: CappedBuffer = field(init=False)
    stderr: CappedBuffer = field(init=False)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    listeners: list[asyncio.Queue[tuple[str, str] | None]] = field(default_factory=list)
    _decoders: dict[str, codecs.IncrementalDecoder] = field(default_factory=dict)
    _cached: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.stdout = CappedBuffer(self.cap)
        self.stderr = CappedBuffer(self.cap)

    def feed(self, stream: str, data: bytes) -> None:
        (self.stdout if stream == "stdout" else self.stderr).write(data)
        if self.listeners:
            dec = self._decoders.get(stream)
            if dec is None:
                dec = self._decoders[stream] = codecs.getincrementaldecoder("utf-8")("replace")
            text = dec.decode(data)
            if text:
                for q in self.listeners:
                    q.put_nowait((stream, text))

    def finish(self) -> None:
        if self.listeners:
            for stream, dec in self._decoders.items():
                rest = dec.decode(b"", final=True)
                if rest:
                    for q in self.listeners:
                        q.put_nowait((stream, rest))
            for q in self.listeners:
                q.put_nowait(None)
        self.completed_at = time.time()
        self.proc = None
        self.done.set()

    @property
    def finished(self) -> bool:
        return self.done.is_set()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill_group()

    def to_dict(self) -> dict[str, Any]:
        if self._cached is not None:
            return self._cached
        out = {
            "job_id": self.job_id,
            "sandbox_id": self.sandbox_id,
            "command": self.command,
            "status": self.status,
            "stdout": self.stdout.text(),
            "stderr": self.stderr.text(),
            "exit_code": self.exit_code,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "completed_at": self.completed_at,
            "error": self.error,
            "timed_out": self.timed_out,
            "stdout_truncated": self.stdout.truncated,
            "stderr_truncated": self.stderr.truncated,
            "usage": self.usage,
        }
        if self.finished:
            self._cached = out
        return out


class JobStore:
    def __init__(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        self.running: dict[str, Job] = {}
        self.finished: OrderedDict[str, Job] = OrderedDict()
        self.evicted: OrderedDict[str, None] = OrderedDict()

    def new(self, command: str | list[str], cap: int, job_id: str | None = None) -> Job:
        """A queued job; ``job_id`` (the orchestrator's choice) must be this sandbox's and new."""
        if job_id is None:
            job_id = f"{self.sandbox_id}.{secrets.token_hex(8)}"
        elif not job_id.startswith(self.sandbox_id + "."):
            raise ApiError(422, "invalid_body", f"job id {job_id!r} is not of this sandbox")
        elif self.get(job_id) is not None or self.was_evicted(job_id):
            raise ApiError(409, "job_exists", f"job id {job_id!r} is taken")
        job = Job(job_id, self.sandbox_id, command, cap)
        self.running[job.job_id] = job
        return job

    def mark_finished(self, job: Job) -> None:
        self.running.pop(job.job_id, None)
        self.finished[job.job_id] = job
        while len(self.finished) > MAX_FINISHED:
            dropped, _ = self.finished.popitem(last=False)
            self.evicted[dropped] = None
        while len(self.evicted) > MAX_EVICTED:
            self.evicted.popitem(last=False)

    def get(self, job_id: str) -> Job | None:
        return self.running.get(job_id) or self.finished.get(job_id)

    def was_evicted(self, job_id: str) -> bool:
        """The job finished here, and its result was dropped for newer ones since."""
        return job_id in self.evicted

    def kill_all(self) -> None:
        for job in list(self.running.values()):
            job.cancelled = True
            job.kill()

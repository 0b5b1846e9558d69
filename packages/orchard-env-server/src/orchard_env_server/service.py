"""Sandbox lifecycle: the registry, tenancy, readiness, limits and the reaper."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from . import metrics
from .agent_client import AgentClient
from .backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    ImageUnavailable,
    SandboxExists,
)
from .bridges import BridgeRelay, validate_bridges
from .errors import (
    ApiError,
    backend_unavailable,
    conflict,
    image_unavailable,
    overloaded,
    quota_exceeded,
    sandbox_not_found,
    wait_timeout,
)
from .job_ledger import JobLedger
from .pools import UNOWNED, WarmPools
from .records import AgentEndpoint, SandboxRecord
from .schemas import CreateSandboxRequest
from .settings import Settings

log = logging.getLogger("orchard_env_server")
_REAPS_AT_ONCE = 8  # removals of deleted sandboxes run at once (the rest queue)


class SandboxService:
    """Owns every sandbox record; the API layer calls only this and the agent client."""

    def __init__(
        self, settings: Settings, backend: Backend, agents: AgentClient | None = None
    ) -> None:
        self.settings = settings
        self.backend = backend
        self._agents = agents
        self._records: dict[str, SandboxRecord] = {}
        self._inflight = 0
        self._reaper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Deleted sandboxes whose removal goes on after the client had its answer.
        self._reaping: dict[str, asyncio.Task[None]] = {}
        # A few removals at a time: a burst of deletes is answered first, not interleaved
        # with a thousand removals competing for the same loop.
        self._reap_slots = asyncio.Semaphore(_REAPS_AT_ONCE)
        self._checking: set[str] = set()
        self._last_health_check = 0.0
        self.jobs = JobLedger()
        self._bridges = BridgeRelay(agents, settings) if agents is not None else None
        self._pools: WarmPools | None = None

    # -- start and stop -------------------------------------------------------------
    async def start(self) -> None:
        if self.settings.warm_pools and not self.backend.supports_warm_pools:
            raise BackendError(f"warm pools are not supported on the {self.backend.name} backend")
        self.backend.attach(self)
        for record in await self.backend.start():
            if record.tenant == UNOWNED:  # an earlier run's pooled sandbox: pools refill
                if record.status != "failed":
                    self._spawn(self._destroy(record, "terminated", None))
                continue
            self._records[record.sandbox_id] = record
            if record.status == "failed":  # kept for failed_retention_s to say what happened
                log.warning("sandbox %s of an earlier run: %s", record.sandbox_id, record.error)
                continue
            record.mark("ready")
            record.touch()
            self._relay_bridges(record)
            log.info("adopted sandbox %s from an earlier run", record.sandbox_id)
        metrics.SANDBOXES.set(len(self._records))
        self._reaper = asyncio.create_task(self._reap_forever(), name="orchard-reaper")
        if self.settings.warm_pools:
            self._pools = WarmPools(
                self.settings.warm_pools,
                self.settings.warm_pool_idle_s,
                self._make_pooled,
                lambda record: self._destroy(record, "terminated", None),
                self.backend.check,
            )
            self._pools.start()

    async def close(self) -> None:
        if self._reaper:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        if self._pools is not None:
            await self._pools.close()
        for task in list(self._tasks):
            task.cancel()
        if self._reaping:  # deleted is deleted: finish before anything else stops
            await asyncio.gather(*self._reaping.values(), return_exceptions=True)
        if self._bridges is not None:
            await self._bridges.close()
        keep = self.settings.keep_sandboxes_on_exit
        if keep is None:
            keep = self.backend.sandboxes_outlive_orchestrator
        await self.backend.close(delete_sandboxes=not keep)

    # -- sandboxes the backend found on its own ---------------------------------------
    def discovered(self, record: SandboxRecord) -> None:
        """A sandbox another replica (or an earlier run) created: serve it too."""
        if record.sandbox_id not in self._records:
            record.touch()
            self._records[record.sandbox_id] = record
            metrics.SANDBOXES.set(len(self._records))
            self._relay_bridges(record)

    def _relay_bridges(self, record: SandboxRecord) -> None:
        if self._bridges is not None:
            self._bridges.start(record)

    def _stop_bridges(self, sandbox_id: str) -> None:
        if self._bridges is not None:
            self._bridges.stop(sandbox_id)

    def lost(self, sandbox_id: str, reason: str) -> None:
        """Deleted behind this process's back: report ``terminated`` until forgotten."""
        record = self._records.get(sandbox_id)
        if record is not None and record.status != "terminated":
            record.mark("terminated", reason)
            self._stop_bridges(sandbox_id)
            self.jobs.lose_sandbox(
                sandbox_id, f"the sandbox was removed while the job ran: {reason}"
            )
            if self._agents is not None:
                self._spawn(self._agents.forget(record.agent))

    def expired(self, sandbox_id: str) -> None:
        """Its ttl ran out and the backend has removed it already: reap it now, as the
        reaper would at its next pass (``terminated``, then forgotten)."""
        record = self._records.get(sandbox_id)
        if record is not None and record.status not in ("failed", "terminated"):
            self._spawn(self._reap(record, self._ttl_reason(record)))

    def agent_gone(self, record: SandboxRecord) -> None:
        """A request found the sandbox's agent unreachable: check the sandbox now rather
        than at the reaper's next pass (a dead sandbox turns ``failed`` with the reason)."""
        if record.sandbox_id not in self._checking and record.status == "ready":
            self._checking.add(record.sandbox_id)
            self._spawn(self._check_now(record))

    async def _check_now(self, record: SandboxRecord) -> None:
        try:
            await self._fail_if_dead(record)
        except Exception:
            log.exception("checking sandbox %s failed", record.sandbox_id)
        finally:
            self._checking.discard(record.sandbox_id)

    # -- lookup ---------------------------------------------------------------------
    def get(self, tenant: str, sandbox_id: str) -> SandboxRecord:
        """The tenant's sandbox; another tenant's id is indistinguishable from a missing one."""
        record = self._records.get(sandbox_id)
        if record is None or record.tenant != tenant:
            raise sandbox_not_found(sandbox_id)
        record.touch()
        return record

    def list(self, tenant: str, labels: dict[str, str]) -> list[SandboxRecord]:
        return [
            r
            for r in self._records.values()
            if r.tenant == tenant and all(r.labels.get(k) == v for k, v in labels.items())
        ]

    def ready_endpoint(self, tenant: str, sandbox_id: str) -> tuple[SandboxRecord, AgentEndpoint]:
        """A sandbox that can take commands now, else 409 saying why not."""
        record = self.get(tenant, sandbox_id)
        if record.status != "ready" or record.agent is None:
            detail = f"sandbox {sandbox_id!r} is {record.status}"
            if record.error:
                detail += f": {record.error}"
            raise conflict(detail, "sandbox_not_ready")
        return record, record.agent

    def count(self) -> int:
        return len(self._records)

    def reaping(self) -> int:
        """Deleted sandboxes whose removal is still under way."""
        return len(self._reaping)

    def pool_stats(self) -> dict[str, dict[str, int]]:
        """Per warm pool: its size and the sandboxes ready and being made."""
        return self._pools.stats() if self._pools is not None else {}

    # -- create / wait / delete -----------------------------------------------------
    async def create(self, tenant: str, req: CreateSandboxRequest) -> SandboxRecord:
        sandbox_id = req.sandbox_id or f"sbx-{secrets.token_hex(6)}"
        if sandbox_id in self._reaping:  # the id's last sandbox is still being removed
            await asyncio.shield(self._reaping[sandbox_id])
        if sandbox_id in self._records:
            raise conflict(f"sandbox id {sandbox_id!r} is taken", "sandbox_exists")
        owned = sum(1 for r in self._records.values() if r.tenant == tenant)
        if owned >= self.settings.max_sandboxes_per_tenant:
            raise quota_exceeded(
                f"tenant has {owned} sandboxes, the limit is {self.settings.max_sandboxes_per_tenant}"
            )
        if self._pools is not None:
            pooled = await self._pools.take(req)
            if pooled is not None and await self._claim(pooled, tenant, req):
                return pooled
        bridges = validate_bridges(
            req.bridges, self.settings.bridge_allowed_upstreams, self.backend.reserved_ports
        )
        if bridges and self._bridges is None:
            raise conflict("this service cannot relay bridges", "bridges_unavailable")
        record = SandboxRecord.from_request(sandbox_id, tenant, req)
        record.bridges = bridges
        if record.ttl_seconds is None:
            record.ttl_seconds = self.settings.default_ttl_seconds
        self._records[sandbox_id] = record
        metrics.SANDBOXES.set(len(self._records))
        started = time.monotonic()
        try:
            async with record.lock:
                await self.backend.create(record)
        except SandboxExists as exc:  # another replica's: nothing of it may be touched
            self._records.pop(sandbox_id, None)
            metrics.SANDBOXES.set(len(self._records))
            raise conflict(str(exc), "sandbox_exists") from None
        except (BackendUnavailable, ImageUnavailable) as exc:
            self._records.pop(sandbox_id, None)
            metrics.SANDBOXES.set(len(self._records))
            with contextlib.suppress(Exception):
                await self.backend.delete(record)
            if isinstance(exc, ImageUnavailable):
                raise image_unavailable(exc.reason, str(exc)) from None
            raise backend_unavailable(f"cannot create sandboxes now: {exc}") from None
        except BackendError as exc:
            record.mark("failed", str(exc))
            metrics.CREATE_FAILURES.inc()
            return record
        except BaseException:
            self._records.pop(sandbox_id, None)
            with contextlib.suppress(Exception):
                await self.backend.delete(record)
            raise
        self._spawn(self._await_ready(record, started))
        # Fast backends are ready almost at once; answering `ready` saves the client a call.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(record.settled.wait()), 0.5)
        return record

    async def _claim(self, record: SandboxRecord, tenant: str, req: CreateSandboxRequest) -> bool:
        """Hand a pooled sandbox to ``tenant`` with the request's settings; False (and the
        sandbox removed) when the backend cannot record its new owner."""
        record.tenant = tenant
        record.labels = dict(req.labels or {})
        record.timeout = 3600.0 if req.timeout is None else float(req.timeout)
        record.ttl_seconds = req.ttl_seconds or self.settings.default_ttl_seconds
        record.idle_timeout_seconds = req.idle_timeout_seconds
        record.created_at = time.time()
        try:
            await self.backend.claim(record)
        except BackendError as exc:
            log.warning("could not hand out pooled sandbox %s: %s", record.sandbox_id, exc)
            self._spawn(self._destroy(record, "terminated", None))
            return False
        record.touch()
        self._records[record.sandbox_id] = record
        metrics.SANDBOXES.set(len(self._records))
        metrics.POOL_CLAIMS.inc()
        return True

    async def _make_pooled(self, record: SandboxRecord) -> None:
        """Create a sandbox for a warm pool and wait until it is ready (else raise)."""
        async with record.lock:
            await self.backend.create(record)
        await asyncio.wait_for(self.backend.wait_ready(record), record.timeout)
        record.mark("ready")

    async def _await_ready(self, record: SandboxRecord, started: float) -> None:
        try:
            await asyncio.wait_for(self.backend.wait_ready(record), record.timeout)
            if record.bridges and self._bridges is not None and record.status == "pending":
                await self._bridges.configure(record)  # listening before it says ready
        except BackendError as exc:
            record.mark("failed", str(exc))
        except ApiError as exc:
            record.mark("failed", f"cannot set up its bridges: {exc.detail}")
        except TimeoutError:
            record.mark("failed", f"not ready within {record.timeout:g} s")
        else:
            if record.status == "pending":
                record.mark("ready")
                self._relay_bridges(record)
                record.touch()  # the idle clock starts when the sandbox can be used
                metrics.CREATE_SECONDS.observe(time.monotonic() - started)
        if record.status == "failed":
            metrics.CREATE_FAILURES.inc()
            log.warning("sandbox %s failed: %s", record.sandbox_id, record.error)

    async def wait(self, tenant: str, sandbox_id: str, timeout: float) -> SandboxRecord:
        record = self.get(tenant, sandbox_id)
        try:
            await asyncio.wait_for(asyncio.shield(record.settled.wait()), timeout)
        except TimeoutError:
            raise wait_timeout(
                f"sandbox {sandbox_id!r} still {record.status} after {timeout:g} s"
            ) from None
        return record

    async def delete(self, tenant: str, sandbox_id: str) -> None:
        """Answer once the sandbox runs nothing and is doomed for good (the backend's
        ``retire``); the rest of its removal runs in the background (``reaping``)."""
        record = self.get(tenant, sandbox_id)
        retired = await self._retire(record, "terminated", None)
        self._records.pop(sandbox_id, None)
        metrics.SANDBOXES.set(len(self._records))
        if retired:
            task = asyncio.create_task(self._reap_deleted(record))
            self._reaping[sandbox_id] = task
            metrics.REAPING.set(len(self._reaping))
            task.add_done_callback(lambda done: self._reaped(sandbox_id, done))

    def _reaped(self, sandbox_id: str, task: asyncio.Task[None]) -> None:
        if self._reaping.get(sandbox_id) is task:
            del self._reaping[sandbox_id]
            metrics.REAPING.set(len(self._reaping))

    async def _reap_deleted(self, record: SandboxRecord) -> None:
        try:
            async with self._reap_slots:
                await self._remove(record)
        except Exception:  # the backend's next start finishes it (a tombstone says so)
            log.exception("removing deleted sandbox %s failed", record.sandbox_id)

    async def _destroy(self, record: SandboxRecord, status: str, error: str | None) -> None:
        if await self._retire(record, status, error):
            await self._remove(record)

    async def _retire(self, record: SandboxRecord, status: str, error: str | None) -> bool:
        """Mark the record, end its jobs and bridges, stop the sandbox; False when it was
        terminated already."""
        async with record.lock:
            if record.status == "terminated":
                return False
            record.mark(status, error)
            self._stop_bridges(record.sandbox_id)
            why = (
                f"the sandbox failed: {error}" if status == "failed" else "the sandbox was deleted"
            )
            self.jobs.lose_sandbox(record.sandbox_id, f"{why} while the job ran")
            await self.backend.retire(record)
            return True

    async def _remove(self, record: SandboxRecord) -> None:
        await self.backend.reap(record)
        if self._agents is not None:
            await self._agents.forget(record.agent)

    # -- concurrency limit ----------------------------------------------------------
    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Bound work in flight; beyond the bound answer 503 so clients back off."""
        if self._inflight >= self.settings.max_inflight:
            metrics.REJECTED.inc()
            raise overloaded(f"{self._inflight} operations in flight; retry shortly")
        self._inflight += 1
        metrics.INFLIGHT.set(self._inflight)
        try:
            yield
        finally:
            self._inflight -= 1
            metrics.INFLIGHT.set(self._inflight)

    # -- reaper ---------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reaper_interval_s)
            try:
                await self.reap_once()
            except Exception:
                log.exception("reaper pass failed")

    async def reap_once(self) -> None:
        """Delete expired and idle sandboxes, fail dead ones, forget old failures."""
        now_wall, now = time.time(), time.monotonic()
        check_health = now - self._last_health_check >= self.settings.health_check_interval_s
        if check_health:
            self._last_health_check = now
        for record in list(self._records.values()):
            reason: str | None = None
            if record.status in ("failed", "terminated"):
                if (
                    record.finished_at
                    and now - record.finished_at > self.settings.failed_retention_s
                ):
                    await self._forget(record)
                continue
            if record.expires_at is not None and now_wall >= record.expires_at:
                reason = self._ttl_reason(record)
            elif (
                record.status == "ready"  # a sandbox still starting is not idle
                and record.busy == 0  # nor is one whose exec or transfer is under way
                and record.idle_timeout_seconds is not None
                and now - record.last_active >= record.idle_timeout_seconds
            ):
                reason = f"idle for {record.idle_timeout_seconds:g} s"
            if reason:
                await self._reap(record, reason)
                continue
            if check_health:
                await self._fail_if_dead(record)

    @staticmethod
    def _ttl_reason(record: SandboxRecord) -> str:
        return f"ttl of {record.ttl_seconds:g} s reached"

    async def _reap(self, record: SandboxRecord, reason: str) -> None:
        log.info("reaping sandbox %s: %s", record.sandbox_id, reason)
        metrics.REAPED.inc()
        await self._destroy(record, "terminated", reason)
        await self._forget(record)

    async def _fail_if_dead(self, record: SandboxRecord) -> None:
        """Ask the backend whether a ready sandbox still lives; a dead one turns ``failed``."""
        if record.status != "ready":
            return
        dead = await self.backend.check(record)
        if dead and record.status == "ready":
            log.warning("sandbox %s died: %s", record.sandbox_id, dead)
            await self._destroy(record, "failed", dead)

    async def _forget(self, record: SandboxRecord) -> None:
        self._stop_bridges(record.sandbox_id)
        with contextlib.suppress(ApiError):
            await self.backend.delete(record)
        self._records.pop(record.sandbox_id, None)
        metrics.SANDBOXES.set(len(self._records))

"""Warm pools: per image, sandboxes created ahead of demand, so that a create is a claim.

A pooled sandbox belongs to no tenant (``UNOWNED``) and is in no tenant's list. A create
that asks for nothing a pooled sandbox was not made with (its image, the default network
block, no id, cpu, memory, env, workdir or bridges of its own) takes one; it is the
caller's from then on and never returns to a pool, so no sandbox is ever handed to a
second tenant or reused: its state is as fresh as a new one's. The pool refills in the
background; one not drawn from for ``idle_s`` is emptied (its sandboxes cost memory) and
fills again at the next create of its image.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable

import attrs

from .records import SandboxRecord
from .schemas import CreateSandboxRequest

log = logging.getLogger("orchard_env_server.pools")

# No API key maps to the empty tenant name (parse_api_keys refuses it).
UNOWNED = ""


def parse_pools(items: list[str]) -> dict[str, int]:
    """``IMAGE=SIZE`` items (``host=8``) as a mapping; sizes are positive."""
    pools: dict[str, int] = {}
    for item in items:
        image, sep, size = item.strip().rpartition("=")
        if not sep or not image or not size.isdigit() or int(size) < 1:
            raise ValueError(f"invalid warm pool {item!r}: expected IMAGE=SIZE, SIZE ≥ 1")
        pools[image] = int(size)
    return pools


def eligible(req: CreateSandboxRequest) -> bool:
    """Whether a pooled sandbox (made with defaults) is what this request asks for."""
    return (
        req.sandbox_id is None
        and req.block_network in (None, True)
        and req.cpu is None
        and req.memory is None
        and not req.env
        and req.workdir is None
        and not req.bridges
    )


# Makes one pooled sandbox ready (raises if it cannot) / removes one / None while it lives.
Make = Callable[[SandboxRecord], Awaitable[None]]
Remove = Callable[[SandboxRecord], Awaitable[None]]
Check = Callable[[SandboxRecord], Awaitable[str | None]]


@attrs.define
class _Pool:
    image: str
    size: int
    ready: deque[SandboxRecord] = attrs.Factory(deque)
    making: int = 0
    last_drawn: float = attrs.Factory(time.monotonic)
    drained: bool = False
    failures: int = 0
    wakeup: asyncio.Event = attrs.Factory(asyncio.Event)


class WarmPools:
    """The pools of one service; ``make``/``remove`` are the service's create and delete."""

    def __init__(
        self, sizes: dict[str, int], idle_s: float, make: Make, remove: Remove, check: Check
    ) -> None:
        self._pools = {image: _Pool(image, size) for image, size in sizes.items()}
        self._idle_s = idle_s
        self._make, self._remove, self._check = make, remove, check
        self._tasks: list[asyncio.Task[None]] = []
        self._removals: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        for pool in self._pools.values():
            self._tasks.append(
                asyncio.create_task(self._keep_filled(pool), name=f"pool-{pool.image}")
            )

    async def close(self) -> None:
        """Stop refilling and remove every pooled sandbox."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.gather(*self._removals, return_exceptions=True)
        for pool in self._pools.values():
            while pool.ready:
                await self._quietly_remove(pool.ready.popleft())

    async def take(self, req: CreateSandboxRequest) -> SandboxRecord | None:
        """A ready pooled sandbox for this request, or None (then create as usual)."""
        pool = self._pools.get(req.image)
        if pool is None or not eligible(req):
            return None
        pool.last_drawn = time.monotonic()
        pool.drained = False
        pool.wakeup.set()
        while pool.ready:
            record = pool.ready.popleft()
            why = await self._check(record)
            if why is None:
                return record
            log.warning(
                "warm pool %s: %s died while pooled: %s", pool.image, record.sandbox_id, why
            )
            self._spawn_removal(record)
        return None

    def stats(self) -> dict[str, dict[str, int]]:
        """Per image: the target size, sandboxes ready and being made (``/resources``)."""
        return {
            p.image: {"size": p.size, "ready": len(p.ready), "making": p.making}
            for p in self._pools.values()
        }

    async def _keep_filled(self, pool: _Pool) -> None:
        while True:
            if time.monotonic() - pool.last_drawn > self._idle_s and not pool.drained:
                pool.drained = True
                log.info("warm pool %s idle for %g s: emptied", pool.image, self._idle_s)
                while pool.ready:
                    await self._quietly_remove(pool.ready.popleft())
            if pool.drained or len(pool.ready) >= pool.size:
                pool.wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(pool.wakeup.wait(), min(self._idle_s, 5.0))
                continue
            await self._add_one(pool)

    async def _add_one(self, pool: _Pool) -> None:
        record = SandboxRecord.from_request(
            f"sbx-{secrets.token_hex(6)}", UNOWNED, CreateSandboxRequest(image=pool.image)
        )
        pool.making += 1
        try:
            await self._make(record)
        except asyncio.CancelledError:  # the service stops: nothing may be left behind
            await self._quietly_remove(record)
            raise
        except Exception as exc:  # an image that cannot start: back off, say why
            pool.failures += 1
            delay = min(60.0, 0.5 * 2 ** min(pool.failures, 7))
            log.warning(
                "warm pool %s: a sandbox failed (%s); retry in %g s", pool.image, exc, delay
            )
            await self._quietly_remove(record)
            await asyncio.sleep(delay)
            return
        finally:
            pool.making -= 1
        pool.failures = 0
        pool.ready.append(record)

    def _spawn_removal(self, record: SandboxRecord) -> None:
        task = asyncio.create_task(self._quietly_remove(record))
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    async def _quietly_remove(self, record: SandboxRecord) -> None:
        try:
            await self._remove(record)
        except Exception:
            log.exception("warm pool: removing %s failed", record.sandbox_id)

"""Calling the async Orchard client from the OpenHands agent's worker threads.

The OpenHands conversation is synchronous and runs in a thread of its own; the sandbox
handle (:class:`orchard_env_client.AsyncSandbox`) belongs to the event loop that prepared
the task. :class:`LoopBridge` submits a coroutine to that loop and waits for its result,
so both tool executors share one client and its connection pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any

__all__ = ["LoopBridge"]


class LoopBridge:
    """Runs coroutines on ``loop`` (owned by another thread) and waits for them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    @classmethod
    def current(cls) -> LoopBridge:
        """A bridge to the event loop running in the calling thread."""
        return cls(asyncio.get_running_loop())

    def run[T](self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """``coro``'s result; raises what it raises, or ``TimeoutError`` after ``timeout`` s.

        Must not be called from the loop's own thread (that would deadlock).
        """
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            coro.close()
            raise RuntimeError("LoopBridge.run called from its own event loop's thread")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise TimeoutError(f"no result after {timeout} s") from exc

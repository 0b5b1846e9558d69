"""LIST then WATCH one kind of object, forever, keeping an in-memory copy.

The watch resumes from the last resourceVersion it saw (bookmarks included), so a dropped
connection loses nothing. When the server has compacted that version away it answers
410 Gone; the watcher then lists again and reports the difference (objects that vanished
meanwhile come out as deletions). Connection trouble is retried with capped backoff.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

from .api import KubeApi, KubeError

log = logging.getLogger("orchard_env_server")

Handler = Callable[[dict[str, Any]], None]


class ResourceWatcher:
    """Keeps ``objects`` (name → object) current; calls the handlers on every change."""

    def __init__(
        self,
        api: KubeApi,
        kind: str,
        selector: str,
        on_upsert: Handler,
        on_delete: Handler,
        watch_timeout_s: int = 300,
    ) -> None:
        self.kind = kind
        self.objects: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self.lists = 0  # full LISTs: the first, and one after every 410 or failed resume
        self.gone = 0  # 410 answers seen
        self.reconnects = 0  # watches re-opened from a known resourceVersion
        self.error: str | None = None  # the trouble of the moment, for /health
        self.version: str | None = None  # the last resourceVersion seen; None: list first
        self._api = api
        self._selector = selector
        self._on_upsert = on_upsert
        self._on_delete = on_delete
        self._timeout_s = watch_timeout_s

    async def run_forever(self) -> None:
        backoff = 0.2
        while True:
            try:
                if self.version is None:
                    self.version = await self._relist()
                await self._watch()
                self.reconnects += 1
                self.error = None
                backoff = 0.2
                continue
            except KubeError as exc:
                if exc.gone:
                    self.gone += 1
                    log.info(
                        "%s watch: resourceVersion %s is gone; listing again",
                        self.kind,
                        self.version,
                    )
                    self.version = None
                    continue
                self.error = f"watching {self.kind}: {exc}"
                log.warning("%s; retrying in %.1f s", self.error, backoff)
            await asyncio.sleep(backoff * (1 + random.random() / 2))
            backoff = min(backoff * 2, 5.0)
            if self.version is not None:
                self.reconnects += 1

    async def _relist(self) -> str:
        items, version = await self._api.list_objects(self.kind, self._selector)
        self.lists += 1
        fresh = {item["metadata"]["name"]: item for item in items}
        vanished = [obj for name, obj in self.objects.items() if name not in fresh]
        self.objects = fresh
        for obj in vanished:
            self._on_delete(obj)
        for obj in fresh.values():
            self._on_upsert(obj)
        self.synced.set()
        self.error = None
        return version

    async def _watch(self) -> None:
        """Follow events until the server ends the watch; ``version`` tracks each one, so
        a watch that breaks mid-stream resumes after the last event it delivered."""
        assert self.version is not None
        # Spread the server-side timeouts so many replicas do not reconnect in step.
        timeout = int(self._timeout_s * (0.8 + random.random() * 0.4))
        async for event in self._api.watch(self.kind, self._selector, self.version, timeout):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                raise KubeError(int(obj.get("code") or 0), str(obj.get("message")))
            self.version = str(obj["metadata"]["resourceVersion"])
            if kind == "BOOKMARK":
                continue
            name = obj["metadata"]["name"]
            if kind == "DELETED":
                self.objects.pop(name, None)
                self._on_delete(obj)
            else:
                self.objects[name] = obj
                self._on_upsert(obj)

    def stats(self) -> dict[str, Any]:
        return {
            "objects": len(self.objects),
            "lists": self.lists,
            "gone": self.gone,
            "reconnects": self.reconnects,
            "error": self.error,
        }

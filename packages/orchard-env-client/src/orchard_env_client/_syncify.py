"""Derive a blocking API from the async classes, by introspection (Modal's approach).

``Portal`` runs an event loop in a daemon thread. A class declared as
``class Sandbox(SyncWrapper, wraps=AsyncSandbox)`` gets, for every public member of the
async class that it does not define itself:

* ``async def`` methods -> blocking methods (``run_coroutine_threadsafe().result()``),
* async generator methods -> generator methods (each item fetched through the portal),
* other methods and properties -> delegated as they are,
* ``__aenter__``/``__aexit__`` -> ``__enter__``/``__exit__``;

plain attributes (``sandbox_id``, ``info``) are read through ``__getattr__``. Results that
are instances of a wrapped async class (or lists of them) come back wrapped in their sync
class, sharing the portal. Exceptions propagate unchanged, with their type. Adding an async
method therefore needs no sync edit; its typed signature reaches ``sync.pyi`` by
re-running ``python -m orchard_env_client._stubgen`` (a test fails while it is stale).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, ClassVar, TypeVar

T = TypeVar("T")

_SYNC_OF: dict[type, type[SyncWrapper]] = {}


async def _await(awaitable: Awaitable[T]) -> T:
    return await awaitable


class Portal:
    """An event loop in a background daemon thread that sync code submits coroutines to."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._closed = False
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="orchard-env-client-loop", daemon=True
        )
        self._thread.start()

    @property
    def closed(self) -> bool:
        """True after ``close``."""
        return self._closed

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run ``awaitable`` on the portal's loop and block until it finishes."""
        if self._closed:
            if inspect.iscoroutine(awaitable):
                awaitable.close()
            raise RuntimeError("this client is closed")
        if threading.current_thread() is self._thread:
            raise RuntimeError("a sync client method was called from its own event loop")
        future = asyncio.run_coroutine_threadsafe(_await(awaitable), self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def iterate(self, iterator: AsyncIterator[T]) -> Iterator[T]:
        """A blocking generator over an async iterator; closing it closes the iterator."""
        try:
            while True:
                try:
                    item = self.run(iterator.__anext__())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None and not self._closed:
                self.run(aclose())

    def close(self) -> None:
        """Stop the loop and join its thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def to_sync(value: Any, portal: Portal) -> Any:
    """Wrap async handles (and lists of them) in their sync classes; others pass through."""
    for klass in type(value).__mro__:
        sync_cls = _SYNC_OF.get(klass)
        if sync_cls is not None:
            return sync_cls._from_async(value, portal)
    if isinstance(value, list):
        return [to_sync(v, portal) for v in value]
    return value


def _wrap_coroutine(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def method(self: SyncWrapper, *args: Any, **kwargs: Any) -> Any:
        return to_sync(self._portal.run(getattr(self._async, name)(*args, **kwargs)), self._portal)

    return method


def _wrap_asyncgen(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def method(self: SyncWrapper, *args: Any, **kwargs: Any) -> Iterator[Any]:
        iterator = getattr(self._async, name)(*args, **kwargs)
        for item in self._portal.iterate(iterator):
            yield to_sync(item, self._portal)

    return method


def _wrap_plain(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def method(self: SyncWrapper, *args: Any, **kwargs: Any) -> Any:
        return to_sync(getattr(self._async, name)(*args, **kwargs), self._portal)

    return method


def _wrap_property(name: str, prop: property) -> property:
    def getter(self: SyncWrapper) -> Any:
        return to_sync(getattr(self._async, name), self._portal)

    return property(getter, doc=prop.__doc__)


def public_members(async_cls: type) -> dict[str, Any]:
    """The async class's public methods and properties, by name (base classes first)."""
    members: dict[str, Any] = {}
    for klass in reversed(async_cls.__mro__[:-1]):  # skip ``object``
        for name, member in vars(klass).items():
            if not name.startswith("_") and (callable(member) or isinstance(member, property)):
                members[name] = member
    return members


class SyncWrapper:
    """Base of the derived sync classes; see the module docstring."""

    _async_cls: ClassVar[type]
    _async: Any
    _portal: Portal

    def __init_subclass__(cls, *, wraps: type, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._async_cls = wraps
        _SYNC_OF[wraps] = cls
        for name, member in public_members(wraps).items():
            if name in cls.__dict__:
                continue  # a hand-written override in the sync class wins
            if isinstance(member, property):
                setattr(cls, name, _wrap_property(name, member))
            elif inspect.isasyncgenfunction(member):
                setattr(cls, name, _wrap_asyncgen(name, member))
            elif inspect.iscoroutinefunction(member):
                setattr(cls, name, _wrap_coroutine(name, member))
            else:
                setattr(cls, name, _wrap_plain(name, member))
        if hasattr(wraps, "__aenter__") and "__enter__" not in cls.__dict__:
            cls.__enter__ = _enter  # type: ignore[attr-defined]
            cls.__exit__ = _exit  # type: ignore[attr-defined]

    @classmethod
    def _from_async(cls: type[T], obj: Any, portal: Portal) -> T:
        inst = object.__new__(cls)
        inst._async = obj  # type: ignore[attr-defined]
        inst._portal = portal  # type: ignore[attr-defined]
        return inst

    def __getattr__(self, name: str) -> Any:
        # only reached for names not found normally: plain attributes of the async object
        if name.startswith("__") or name in ("_async", "_portal"):
            raise AttributeError(name)
        return to_sync(getattr(self._async, name), self._portal)

    def __repr__(self) -> str:
        # The async object says what to show (``_describe``), under the sync class's name.
        describe = getattr(self._async, "_describe", None)
        body = describe() if describe is not None else repr(self._async)
        return f"<{type(self).__name__} {body}>"


def _enter(self: SyncWrapper) -> Any:
    self._portal.run(self._async.__aenter__())
    return self


def _exit(self: SyncWrapper, *exc_info: Any) -> None:
    self._portal.run(self._async.__aexit__(*exc_info))

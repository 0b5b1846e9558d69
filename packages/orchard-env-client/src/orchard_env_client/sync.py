"""The blocking API: ``SandboxClient``, ``Sandbox`` and ``JobHandle``, derived from the async one.

Nothing here re-implements a request: each class is generated from its async counterpart
by ``_syncify.SyncWrapper`` (methods, generators, context managers). Only the client's
construction and closing are written by hand, because the client owns the ``Portal``
(the background event loop) that its sandboxes and jobs share.

Typing: mypy and IDEs read ``sync.pyi``, which ``python -m orchard_env_client._stubgen``
generates from the async signatures (``AsyncSandbox`` -> ``Sandbox``, ``AsyncIterator`` ->
``Iterator``, coroutines -> plain return types); a test fails when it is out of date.
"""

from __future__ import annotations

import inspect
from typing import Any

from ._client import AsyncSandboxClient
from ._sandbox import AsyncJobHandle, AsyncSandbox
from ._syncify import Portal, SyncWrapper

__all__ = ["JobHandle", "Sandbox", "SandboxClient"]


class JobHandle(SyncWrapper, wraps=AsyncJobHandle):
    """A background job (from ``Sandbox.start``): ``status()``, ``wait()``, ``cancel()``."""


class Sandbox(SyncWrapper, wraps=AsyncSandbox):
    """A handle on one sandbox (blocking); ``with`` deletes it on exit."""


class SandboxClient(SyncWrapper, wraps=AsyncSandboxClient):
    """Blocking client of an Orchard Env server; same arguments as ``AsyncSandboxClient``.

    Runs the async client on a private event loop in a background thread. Used as ``with``,
    it deletes the sandboxes it created on exit (when ``auto_cleanup``), then closes.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._portal = Portal()

        async def build() -> AsyncSandboxClient:
            return AsyncSandboxClient(*args, **kwargs)

        try:
            self._async = self._portal.run(build())
        except BaseException:
            self._portal.close()
            raise

    def close(self) -> None:
        """Close the HTTP connections and stop the background loop."""
        if self._portal.closed:
            return
        try:
            self._portal.run(self._async.close())
        finally:
            self._portal.close()

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._portal.closed:
            return
        try:
            self._portal.run(self._async.__aexit__(*exc_info))
        finally:
            self._portal.close()


SandboxClient.__init__.__signature__ = inspect.signature(AsyncSandboxClient.__init__)  # type: ignore[attr-defined]

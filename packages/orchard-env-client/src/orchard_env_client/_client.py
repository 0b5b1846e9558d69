"""``AsyncSandboxClient``: the one implementation of the SDK (the sync client wraps it)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import types
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from . import models
from ._http import HttpCore, RetryPolicy
from ._sandbox import WAIT_SLICE, AsyncSandbox
from .errors import NotFound, SandboxFailed, SandboxTimeout


def _without_credentials(url: str) -> str:
    """``url`` less any ``user:password@`` in it."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


class AsyncSandboxClient:
    """Async client of an Orchard Env server.

    ``base_url`` falls back to ``$ORCHARD_ENV_URL``, then ``http://127.0.0.1:8000``;
    ``api_key`` to ``$ORCHARD_ENV_API_KEY`` (sent as ``X-API-Key``). ``timeout`` is the
    per-request HTTP timeout (long waits raise it as needed). Idempotent requests are
    retried ``max_retries`` times on 503 / connection errors. ``transport`` is handed to
    httpx (tests pass an ``httpx.MockTransport``); by default it is aiohttp's connection
    pool when aiohttp is installed (``pip install orchard-env-client[fast]``; set
    ``ORCHARD_ENV_CLIENT_TRANSPORT=httpx`` for httpx's own), else httpx's own. Used as ``async with``, it deletes the
    sandboxes it created on exit when ``auto_cleanup`` is true, then closes.
    """

    auto_cleanup: bool

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        auto_cleanup: bool = True,
        max_retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = HttpCore(
            base_url, api_key, timeout, RetryPolicy(max_retries=max_retries), transport
        )
        self.auto_cleanup = auto_cleanup
        self._created: dict[str, None] = {}  # ordered set of ids this client created

    @property
    def base_url(self) -> str:
        """The server URL in use."""
        return self._http.base_url

    @property
    def created_sandbox_ids(self) -> list[str]:
        """Ids of the sandboxes this client created and has not deleted."""
        return list(self._created)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._describe()}>"

    def _describe(self) -> str:
        """What ``repr`` shows, here and in the sync client: the URL (without any
        credentials in it; the API key never), and whether the client is closed."""
        url = _without_credentials(self.base_url)
        return f"url={url}" + (" closed" if self._http.closed else "")

    async def __aenter__(self) -> AsyncSandboxClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        try:
            if self.auto_cleanup:
                await self.cleanup_all()
        finally:
            await self.close()

    async def close(self) -> None:
        """Close the HTTP connections (sandboxes are left alone)."""
        await self._http.aclose()

    # ------------------------------------------------------------ sandboxes

    async def create_sandbox(
        self,
        image: str,
        *,
        block_network: bool = True,
        sandbox_id: str | None = None,
        cpu: str | None = None,
        memory: str | None = None,
        timeout: float = 600,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        labels: dict[str, str] | None = None,
        ttl_seconds: float | None = None,
        idle_timeout_seconds: float | None = None,
        bridges: Mapping[int | str, str] | None = None,
        wait: bool = True,
    ) -> AsyncSandbox:
        """Create a sandbox and (with ``wait``) block until it is ready.

        Raises ``SandboxFailed`` with the server's error if it fails, ``SandboxTimeout`` if
        it is not ready within ``timeout`` seconds; in both cases (and on any other error
        while waiting) the sandbox is deleted before the exception propagates. Retried on
        503 only when ``sandbox_id`` is given (a retry cannot then create a second sandbox).

        ``bridges`` maps sandbox ports to upstream URLs: inside the sandbox
        ``http://127.0.0.1:<port>/<path>`` reaches ``<upstream URL>/<path>``, relayed by the
        service, though the sandbox has no network (``{4000: "http://10.0.0.5:8080/v1"}``).
        """
        body = models.CreateSandboxRequest(
            image=image,
            block_network=block_network,
            sandbox_id=sandbox_id,
            cpu=cpu,
            memory=memory,
            timeout=timeout,
            env=env,
            workdir=workdir,
            labels=labels,
            ttl_seconds=ttl_seconds,
            idle_timeout_seconds=idle_timeout_seconds,
            bridges=None if bridges is None else {str(k): v for k, v in bridges.items()},
        ).to_json()
        data = await self._http.json(
            "POST", "/sandboxes", json=body, idempotent=sandbox_id is not None
        )
        info = models.Sandbox.from_json(data)
        self._created[info.sandbox_id] = None
        sandbox = AsyncSandbox(self, info)
        if not wait:
            return sandbox
        try:
            await sandbox.wait_ready(timeout)
        except BaseException:
            await asyncio.shield(self._delete_quietly(info.sandbox_id))
            raise
        return sandbox

    async def get_sandbox(self, sandbox_id: str) -> AsyncSandbox:
        """A handle on an existing sandbox (``SandboxNotFound`` if unknown)."""
        data = await self._http.json("GET", f"/sandboxes/{quote(sandbox_id)}", idempotent=True)
        return AsyncSandbox(self, models.Sandbox.from_json(data))

    async def list_sandboxes(self, labels: dict[str, str] | None = None) -> list[models.Sandbox]:
        """This tenant's sandboxes, filtered to those carrying every given label."""
        params = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        data = await self._http.json("GET", "/sandboxes", params=params, idempotent=True)
        items = data.get("sandboxes", []) if isinstance(data, dict) else data
        return [models.Sandbox.from_json(item) for item in items]

    async def delete_sandbox(self, sandbox_id: str) -> None:
        """Delete a sandbox; one that is already gone (404) is not an error."""
        with contextlib.suppress(NotFound):
            await self._http.request("DELETE", f"/sandboxes/{quote(sandbox_id)}", idempotent=True)
        self._created.pop(sandbox_id, None)

    async def cleanup_all(self) -> None:
        """Delete every sandbox this client created (concurrently); re-raises the first error."""
        ids = list(self._created)
        results = await asyncio.gather(
            *(self.delete_sandbox(i) for i in ids), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    # ------------------------------------------------------------ service

    async def health(self) -> models.Health:
        """``GET /health`` (needs no API key)."""
        return models.Health.from_json(await self._http.json("GET", "/health", idempotent=True))

    async def resources(self) -> dict[str, Any]:
        """``GET /resources``: backend capacity and use, as the server reports it."""
        data = await self._http.json("GET", "/resources", idempotent=True)
        return dict(data)

    # ------------------------------------------------------------ internals (used by handles)

    async def _delete_quietly(self, sandbox_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.delete_sandbox(sandbox_id)

    async def _wait_slices(
        self, path: str, deadline: float | None, on_deadline: SandboxTimeout
    ) -> AsyncIterator[Any]:
        """Yield answers of the server-side wait ``path``, asked in slices of ``WAIT_SLICE``.

        A slice that runs out on the server (408) just starts the next one; past
        ``deadline`` (None: never) ``on_deadline`` is raised.
        """
        while True:
            wait_s = WAIT_SLICE
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise on_deadline
                wait_s = min(WAIT_SLICE, remaining)
            try:
                yield await self._http.json(
                    "GET",
                    path,
                    params={"timeout": round(wait_s, 3)},
                    idempotent=True,
                    timeout=wait_s + 10,
                )
            except SandboxTimeout:
                continue

    async def _wait_sandbox(self, sandbox_id: str, timeout: float) -> models.Sandbox:
        """Wait server-side until the sandbox is ready (or failed), at most ``timeout``."""
        path = f"/sandboxes/{quote(sandbox_id)}/wait"
        late = SandboxTimeout(f"sandbox {sandbox_id} not ready after {timeout:g}s")
        async for data in self._wait_slices(path, time.monotonic() + timeout, late):
            info = models.Sandbox.from_json(data)
            if info.status == "ready":
                return info
            if info.status in ("failed", "terminated"):
                raise SandboxFailed(
                    info.error or f"sandbox {sandbox_id} is {info.status}",
                    sandbox=info,
                    code=f"sandbox_{info.status}",
                )
            await asyncio.sleep(0.2)  # the server answered early: do not spin
        raise AssertionError("unreachable")

    async def _wait_job(self, job_id: str, deadline: float | None) -> models.Job:
        """Wait server-side until the job ends, or ``deadline`` passes."""
        path = f"/jobs/{quote(job_id)}/wait"
        late = SandboxTimeout(f"job {job_id} still running", code="job_wait_timeout")
        async for data in self._wait_slices(path, deadline, late):
            job = models.Job.from_json(data)
            if job.done:
                return job
            await asyncio.sleep(0.1)  # the server answered early: do not spin
        raise AssertionError("unreachable")

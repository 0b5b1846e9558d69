"""The host side of the browser environment: a ``BrowserSession`` drives the Chromium that
``browser_server.py`` runs inside a sandbox, through the service's port forwarding.

    async with await BrowserSession.start(sandbox) as browser:
        obs = await browser.reset("http://127.0.0.1:8000/")
        result = await browser.step({"action": "click", "x": 100, "y": 200})

Observations carry the screenshot as PNG bytes, the Set-of-Mark boxes (``marks``) and their
overlay image (``screenshot_som``), and optionally a compact accessibility tree.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
import types
import uuid
from collections.abc import Mapping
from typing import Any

import attrs
import httpx

from orchard_env_client import AsyncJobHandle, AsyncSandbox
from orchard_env_client.errors import OrchardError

from .actions import Action
from .browser_provision import BrowserProvisionError, BrowserRuntime, provision
from .browser_server import TOKEN_HEADER

__all__ = [
    "DEFAULT_PORT",
    "BrowserError",
    "BrowserProvisionError",
    "BrowserRequestError",
    "BrowserSession",
    "BrowserStartError",
    "Mark",
    "Observation",
    "StepResult",
]

DEFAULT_PORT = 9300
STEP_TIMEOUT = 120.0
"""Seconds to wait for one request (an action may wait up to 30 s, a navigation 30 s more)."""
SERVER_JOB_TIMEOUT = 86_400.0
MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""Largest answer read from the browser server (what runs in the sandbox is untrusted)."""
_MAX_MARKS, _MAX_TABS, _MAX_TEXT = 1000, 100, 200_000
"""The server job's kill timer: the service's maximum; ``close()`` ends it sooner."""


class BrowserError(RuntimeError):
    """The browser server failed a request (or cannot be reached); the message says why."""


class BrowserRequestError(BrowserError, ValueError):
    """The browser server refused a request as malformed (HTTP 400)."""


class BrowserStartError(BrowserError):
    """The browser server did not come up; the message carries its stderr tail."""


@attrs.define
class Mark:
    """One numbered interactive element of the Set-of-Mark overlay (viewport CSS px)."""

    id: int
    tag: str
    role: str
    name: str
    x: float
    y: float
    width: float
    height: float

    @property
    def center(self) -> tuple[float, float]:
        """The middle of the element's box: where to click it."""
        return (self.x + self.width / 2, self.y + self.height / 2)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Mark:
        """Parse one mark of an observation."""
        return cls(
            id=int(data["id"]),
            tag=str(data.get("tag", "")),
            role=str(data.get("role", "")),
            name=str(data.get("name", "")),
            x=float(data["x"]),
            y=float(data["y"]),
            width=float(data["width"]),
            height=float(data["height"]),
        )


@attrs.define
class Observation:
    """What the agent sees after a reset or an action."""

    url: str
    title: str
    tabs: list[dict[str, Any]]
    viewport: tuple[int, int]
    screenshot: bytes
    """PNG of the viewport."""
    axtree: str | None = None
    marks: list[Mark] | None = None
    screenshot_som: bytes | None = None
    """PNG of the viewport with the marks' numbered boxes drawn on it."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Observation:
        """Decode the server's observation JSON (base64 screenshots, marks).

        The server runs in the sandbox, so its answer is checked: screenshots must be PNGs
        of the viewport's size, and text, marks and tabs are bounded.
        """
        try:
            viewport = data["viewport"]
            size = (int(viewport["width"]), int(viewport["height"]))
            marks = data.get("marks")
            som = data.get("screenshot_som")
            axtree = data.get("axtree")
            if marks is not None and len(marks) > _MAX_MARKS:
                raise ValueError(f"{len(marks)} marks (at most {_MAX_MARKS})")
            return cls(
                url=str(data["url"])[:_MAX_TEXT],
                title=str(data.get("title") or "")[:_MAX_TEXT],
                tabs=[dict(t) for t in list(data.get("tabs") or [])[:_MAX_TABS]],
                viewport=size,
                screenshot=_viewport_png(data["screenshot"], size),
                axtree=None if axtree is None else str(axtree)[:_MAX_TEXT],
                marks=None if marks is None else [Mark.from_json(m) for m in marks],
                screenshot_som=None if som is None else _viewport_png(som, size),
            )
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise BrowserError(f"malformed observation from the browser server: {exc!r}") from exc

    def mark(self, mark_id: int) -> Mark:
        """The mark numbered ``mark_id``; ``KeyError`` if there is none."""
        for mark in self.marks or []:
            if mark.id == mark_id:
                return mark
        raise KeyError(f"no mark {mark_id} in this observation")


def _flags(body: dict[str, Any], marks: bool, axtree: bool, som: bool | None) -> dict[str, Any]:
    out = {**body, "marks": marks, "axtree": axtree}
    if som is not None:
        out["som"] = som
    return out


def _viewport_png(encoded: str, size: tuple[int, int]) -> bytes:
    """Decode a base64 PNG and check that its header says it is ``size`` pixels."""
    png = base64.b64decode(encoded, validate=True)
    if png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ValueError("a screenshot is not a PNG")
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    if (width, height) != size:
        raise ValueError(f"a screenshot is {width}x{height}, the viewport {size[0]}x{size[1]}")
    return png


@attrs.define
class StepResult:
    """The outcome of one action: the new observation, whether it worked, done/answer."""

    observation: Observation
    ok: bool
    error: str | None
    done: bool
    answer: str | None


class BrowserSession:
    """Chromium in one sandbox, driven over HTTP through the service's port forwarding.

    Make one with ``await BrowserSession.start(sandbox)``; ``close()`` (or ``async with``)
    stops the browser and its server. Not safe for concurrent use: one request at a time.
    """

    def __init__(
        self,
        sandbox: AsyncSandbox,
        job: AsyncJobHandle,
        runtime: BrowserRuntime,
        *,
        port: int,
        viewport: tuple[int, int],
        browser_version: str,
        timings: dict[str, float],
        token: str,
    ) -> None:
        self.sandbox = sandbox
        self.job = job
        self.runtime = runtime
        self.port = port
        self.viewport = viewport
        self.browser_version = browser_version
        self.timings = timings
        """Seconds spent starting: ``provision`` (and its parts), ``server_start``, ``total``."""
        self._headers = {TOKEN_HEADER: token}
        self._closed = False

    def __repr__(self) -> str:
        return f"<BrowserSession {self.sandbox.sandbox_id}:{self.port} Chromium {self.browser_version}>"

    @classmethod
    async def start(
        cls,
        sandbox: AsyncSandbox,
        *,
        port: int = DEFAULT_PORT,
        viewport: tuple[int, int] = (1280, 720),
        startup_timeout: float = 60.0,
    ) -> BrowserSession:
        """Provision the sandbox (see ``browser_provision``), start the server and wait for it.

        Raises ``BrowserProvisionError`` when the sandbox lacks what it needs and
        ``BrowserStartError`` (with the server's stderr) when it does not come up in time.
        """
        started = time.monotonic()
        runtime = await provision(sandbox)
        provisioned = time.monotonic()
        instance = uuid.uuid4().hex
        argv = [
            runtime.python,
            runtime.server_path,
            "--port",
            str(port),
            "--chromium",
            runtime.chromium,
            "--width",
            str(viewport[0]),
            "--height",
            str(viewport[1]),
            "--instance",
            instance,
        ]
        job = await sandbox.start(argv, env=runtime.env, timeout=SERVER_JOB_TIMEOUT, cwd="/tmp")
        try:
            version = await _wait_healthy(sandbox, job, port, instance, startup_timeout)
        except BaseException:
            await _cancel_quietly(job)
            raise
        now = time.monotonic()
        timings = {f"provision_{k}": v for k, v in runtime.timings.items()}
        timings.update(provision=provisioned - started, server_start=now - provisioned)
        timings["total"] = now - started
        return cls(
            sandbox,
            job,
            runtime,
            port=port,
            viewport=viewport,
            browser_version=version,
            timings=timings,
            token=instance,
        )

    async def __aenter__(self) -> BrowserSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------ requests

    async def _post(
        self, path: str, body: Mapping[str, Any], timeout: float = STEP_TIMEOUT
    ) -> dict[str, Any]:
        if self._closed:
            raise BrowserError("this browser session is closed")
        try:
            response = await self.sandbox.port_request(
                self.port,
                "POST",
                path,
                json=dict(body),
                timeout=timeout,
                headers=self._headers,
                max_bytes=MAX_ANSWER_BYTES,
            )
        except (OrchardError, httpx.HTTPError) as exc:
            raise BrowserError(f"browser server unreachable ({path}): {exc}") from exc
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise BrowserError(
                f"browser server answered {path} with HTTP {response.status_code} "
                f"and no JSON object: {response.text[:500]!r}"
            )
        if response.status_code == 400:
            raise BrowserRequestError(f"browser server refused {path}: {data.get('error')}")
        if response.status_code != 200:
            raise BrowserError(
                f"browser server failed {path} (HTTP {response.status_code}): {data.get('error')}"
            )
        return data

    async def reset(
        self, url: str, *, marks: bool = True, axtree: bool = False, som: bool | None = None
    ) -> Observation:
        """A fresh browser context (no cookies, history or extra tabs) with one tab at ``url``.

        ``som``: also the screenshot with the marks' boxes drawn (default: with ``marks``).
        """
        data = await self._post("reset", _flags({"url": url}, marks, axtree, som))
        return Observation.from_json(data["observation"])

    async def step(
        self,
        action: Action | Mapping[str, Any],
        *,
        marks: bool = True,
        axtree: bool = False,
        som: bool | None = None,
    ) -> StepResult:
        """Carry out one action (validated here first: ``ActionError`` if malformed).

        An action that fails in the browser (navigation error, no such tab) is
        ``ok=False`` with ``error`` set, and still has an observation.
        """
        if not isinstance(action, Action):
            action = Action.from_dict(action)
        data = await self._post("step", _flags({"action": action.to_dict()}, marks, axtree, som))
        return StepResult(
            observation=Observation.from_json(data["observation"]),
            ok=bool(data.get("ok")),
            error=data.get("error"),
            done=bool(data.get("done")),
            answer=data.get("answer"),
        )

    async def observe(
        self, *, marks: bool = True, axtree: bool = False, som: bool | None = None
    ) -> Observation:
        """The current observation, without acting."""
        data = await self._post("observe", _flags({}, marks, axtree, som))
        return Observation.from_json(data["observation"])

    async def evaluate(self, expression: str) -> Any:
        """Evaluate a JavaScript expression in the active tab; its JSON value.

        ``BrowserRequestError`` when the expression throws.
        """
        data = await self._post("evaluate", {"expression": expression})
        return data.get("value")

    async def close(self) -> None:
        """Stop the browser and the server process (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.sandbox.port_request(
                self.port, "POST", "close", json={}, timeout=10, headers=self._headers
            )
            await self.job.wait(timeout=15)
        except (OrchardError, httpx.HTTPError):
            pass
        finally:
            await _cancel_quietly(self.job)


async def _cancel_quietly(job: AsyncJobHandle) -> None:
    try:
        if not (await job.refresh()).done:
            await job.cancel()
    except (OrchardError, httpx.HTTPError):
        pass


def _tail(text: str | None, limit: int = 3000) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else "..." + text[-limit:]


async def _wait_healthy(
    sandbox: AsyncSandbox, job: AsyncJobHandle, port: int, instance: str, timeout: float
) -> str:
    """Poll ``GET /health`` until this start's server answers; its Chromium version."""
    deadline = time.monotonic() + timeout
    next_job_check = 0.0
    while True:
        try:
            response = await sandbox.port_request(port, "GET", "health", timeout=5)
            data = response.json() if response.status_code == 200 else None
            if isinstance(data, dict) and data.get("ok") and data.get("instance") == instance:
                return str(data.get("browser_version", ""))
        except (OrchardError, httpx.HTTPError, json.JSONDecodeError):
            pass  # not listening yet
        now = time.monotonic()
        if now >= next_job_check:
            state = await job.refresh()
            if state.done:
                raise BrowserStartError(
                    f"the browser server exited ({state.status}, exit code {state.exit_code}) "
                    f"before answering on port {port}:\n{_tail(state.stderr or state.stdout)}"
                )
            next_job_check = now + 1.0
        if now >= deadline:
            await _cancel_quietly(job)
            state = await job.refresh()
            raise BrowserStartError(
                f"the browser server did not answer on port {port} within {timeout:g} s:\n"
                f"{_tail(state.stderr or state.stdout)}"
            )
        await asyncio.sleep(0.2)

"""A small async client for the Docker Engine API, over its unix socket or TCP.

Only the calls the Docker backend needs, each returning decoded JSON. The SDK from PyPI
is synchronous (requests); this keeps the engine on the same event loop as everything else.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlparse

import httpx

API_VERSION = "v1.41"  # Docker 20.10; newer engines still accept it
DEFAULT_SOCKET = "/var/run/docker.sock"


class EngineError(Exception):
    """The engine answered with an error, or could not be reached."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def not_found(self) -> bool:
        return self.status == 404


def _transport_for(docker_host: str | None) -> tuple[httpx.AsyncHTTPTransport, str]:
    host = docker_host or os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"
    url = urlparse(host)
    if url.scheme == "unix":
        return httpx.AsyncHTTPTransport(uds=url.path), "http://docker"
    if url.scheme in ("tcp", "http"):
        return httpx.AsyncHTTPTransport(), f"http://{url.netloc}"
    raise ValueError(f"unsupported DOCKER_HOST {host!r}: expected unix:///path or tcp://host:port")


class DockerEngine:
    """Engine API calls used by the Docker backend; raises EngineError on any failure."""

    def __init__(self, docker_host: str | None = None) -> None:
        transport, base = _transport_for(docker_host)
        self.address = docker_host or os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"
        self._http = httpx.AsyncClient(
            transport=transport,
            base_url=f"{base}/{API_VERSION}",
            timeout=httpx.Timeout(60.0, connect=5.0),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        ok: tuple[int, ...] = (200, 201, 204),
        timeout: float | None = 60.0,
    ) -> Any:
        try:
            response = await self._http.request(
                method, path, json=json_body, params=params, timeout=timeout
            )
        except httpx.HTTPError as exc:
            raise EngineError(
                None, f"Docker engine at {self.address} unreachable: {exc!r}"
            ) from exc
        if response.status_code not in ok:
            try:
                message = response.json().get("message", response.text)
            except ValueError:
                message = response.text
            raise EngineError(response.status_code, f"{method} {path}: {message}".strip())
        if not response.content:
            return None
        return response.json()

    # -- engine ---------------------------------------------------------------------
    async def version(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", "/version", timeout=5.0)
        return result

    async def info(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", "/info", timeout=10.0)
        return result

    # -- images and volumes ---------------------------------------------------------
    async def image(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", f"/images/{name}/json")
        return result

    async def volume(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", f"/volumes/{name}")
        return result

    async def create_volume(self, name: str, labels: dict[str, str]) -> dict[str, Any]:
        body = {"Name": name, "Labels": labels}
        result: dict[str, Any] = await self._call("POST", "/volumes/create", json_body=body)
        return result

    async def volumes(self, label: str) -> list[dict[str, Any]]:
        params = {"filters": json.dumps({"label": [label]})}
        result = await self._call("GET", "/volumes", params=params)
        return list(result.get("Volumes") or [])

    async def remove_volume(self, name: str) -> None:
        """Remove a volume; a missing one is fine, one in use raises (409)."""
        await self._call("DELETE", f"/volumes/{name}", ok=(204, 404))

    # -- containers -----------------------------------------------------------------
    async def create_container(self, name: str | None, spec: dict[str, Any]) -> str:
        params = {"name": name} if name else None
        result = await self._call("POST", "/containers/create", json_body=spec, params=params)
        return str(result["Id"])

    async def start(self, container: str) -> None:
        await self._call("POST", f"/containers/{container}/start", ok=(204, 304))

    async def wait(self, container: str, timeout: float) -> int:
        result = await self._call("POST", f"/containers/{container}/wait", timeout=timeout)
        return int(result.get("StatusCode", -1))

    async def inspect(self, container: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", f"/containers/{container}/json")
        return result

    async def kill(self, container: str, signal: str = "KILL") -> None:
        await self._call(
            "POST", f"/containers/{container}/kill", params={"signal": signal}, ok=(204, 404, 409)
        )

    async def remove(self, container: str) -> None:
        """Force-remove a container and its anonymous volumes; a missing one is fine."""
        await self._call(
            "DELETE",
            f"/containers/{container}",
            params={"force": "true", "v": "true"},
            ok=(204, 404),
        )

    async def containers(self, labels: list[str]) -> list[dict[str, Any]]:
        """Every container (running or not) carrying all of ``labels`` (``k=v`` or ``k``)."""
        params = {"all": "true", "filters": json.dumps({"label": labels})}
        result: list[dict[str, Any]] = await self._call("GET", "/containers/json", params=params)
        return result

    async def logs_tail(self, container: str, lines: int = 20) -> str:
        """The last lines a container wrote (stdout and stderr), as text."""
        params = {"stdout": "true", "stderr": "true", "tail": str(lines)}
        try:
            response = await self._http.get(f"/containers/{container}/logs", params=params)
        except httpx.HTTPError:
            return ""
        if response.status_code != 200:
            return ""
        return _demultiplex(response.content).decode(errors="replace")

    async def events(self, labels: list[str], since: float) -> AsyncIterator[dict[str, Any]]:
        """Container events for containers with ``labels`` from ``since`` (unix time) on."""
        params = {
            "filters": json.dumps({"type": ["container"], "label": labels}),
            "since": f"{since:.9f}",
        }
        try:
            async with self._http.stream(
                "GET", "/events", params=params, timeout=httpx.Timeout(None)
            ) as response:
                if response.status_code != 200:
                    raise EngineError(response.status_code, "GET /events failed")
                async for line in response.aiter_lines():
                    if line.strip():
                        yield json.loads(line)
        except httpx.HTTPError as exc:
            raise EngineError(None, f"event stream from {self.address} broke: {exc!r}") from exc


def _demultiplex(raw: bytes) -> bytes:
    """Strip the 8-byte frame headers of a non-TTY container's log stream."""
    out = bytearray()
    i = 0
    while i + 8 <= len(raw):
        if raw[i] not in (0, 1, 2) or raw[i + 1 : i + 4] != b"\0\0\0":
            return raw  # not framed (a TTY container's log is plain)
        size = int.from_bytes(raw[i + 4 : i + 8], "big")
        out += raw[i + 8 : i + 8 + size]
        i += 8 + size
    return bytes(out)

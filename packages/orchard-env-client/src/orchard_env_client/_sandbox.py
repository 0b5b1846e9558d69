"""The async handles: ``AsyncSandbox`` (one sandbox) and ``AsyncJobHandle`` (one background job).

Public signatures here use only builtins, ``Any``, ``AsyncIterator``, ``os`` and
``models.*`` names: the sync stub (``sync.pyi``) is generated from them.
"""

from __future__ import annotations

import json as _json
import os
import tarfile
import tempfile
import time
import types
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from . import models
from .errors import error_from_response

if TYPE_CHECKING:
    from ._client import AsyncSandboxClient

WAIT_SLICE = 30.0
"""Longest server-side wait asked for in one request; longer waits loop."""

_CHUNK = 1 << 20


_SERVICE_ERROR_CODES = frozenset(
    {
        "unauthorized",
        "sandbox_not_found",
        "sandbox_not_ready",
        "port_not_listening",
        "bad_upstream",
        "invalid_body",
        "overloaded",
        "backend_unavailable",
    }
)


def _is_service_error(response: httpx.Response) -> bool:
    """Whether an error answer of a forwarded request is the orchestrator's own: its
    ``{"detail", "code"}`` body with one of the codes the port route can give."""
    if "json" not in response.headers.get("content-type", ""):
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return (
        isinstance(body, dict)
        and set(body) == {"detail", "code"}
        and body.get("code") in _SERVICE_ERROR_CODES
    )


def _done(status: str) -> bool:
    return status in ("succeeded", "failed")


class AsyncJobHandle:
    """A command started with ``AsyncSandbox.start``: poll, wait for or cancel it."""

    job_id: str
    sandbox_id: str

    def __init__(self, client: AsyncSandboxClient, job_id: str, sandbox_id: str) -> None:
        self._client = client
        self.job_id = job_id
        self.sandbox_id = sandbox_id
        self._last: models.Job | None = None  # the job as last fetched, for repr

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._describe()}>"

    def _describe(self) -> str:
        """What ``repr`` shows, here and in ``JobHandle``: the id and, once fetched, the
        state last seen (no request is sent)."""
        if self._last is None:
            return self.job_id
        text = f"{self.job_id} state={self._last.status}"
        if self._last.exit_code is not None:
            text += f" exit_code={self._last.exit_code}"
        return text + (" timed_out" if self._last.timed_out else "")

    async def refresh(self) -> models.Job:
        """The job object now (``GET /jobs/{id}``)."""
        data = await self._client._http.json("GET", f"/jobs/{quote(self.job_id)}", idempotent=True)
        self._last = models.Job.from_json(data)
        return self._last

    async def status(self) -> str:
        """The job's status now: ``queued``, ``running``, ``succeeded`` or ``failed``."""
        return (await self.refresh()).status

    async def wait(self, timeout: float | None = None) -> models.Job:
        """Wait until the job ends and return it; ``SandboxTimeout`` if ``timeout`` runs out.

        Waits server-side in slices of at most ``WAIT_SLICE`` seconds; ``None`` waits forever.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        self._last = await self._client._wait_job(self.job_id, deadline)
        return self._last

    async def cancel(self) -> None:
        """Kill the job's process group; the job then ends ``failed``."""
        await self._client._http.request("POST", f"/jobs/{quote(self.job_id)}/cancel")


class AsyncSandbox:
    """A handle on one sandbox: commands, files, lifetime. ``async with`` deletes it on exit."""

    sandbox_id: str
    info: models.Sandbox

    def __init__(self, client: AsyncSandboxClient, info: models.Sandbox) -> None:
        self._client = client
        self.sandbox_id = info.sandbox_id
        self.info = info
        self._deleted = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._describe()}>"

    def _describe(self) -> str:
        """What ``repr`` shows, here and in the sync ``Sandbox``: id, image and the state
        last seen (``info``, or ``deleted`` after ``delete``; no request is sent)."""
        state = "deleted" if self._deleted else self.info.status
        text = f"{self.sandbox_id} image={self.info.image or '?'} state={state}"
        if self.info.error and not self._deleted:
            error = self.info.error if len(self.info.error) <= 60 else self.info.error[:59] + "…"
            text += f" error={error!r}"
        return text

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        await self.delete()

    @property
    def _path(self) -> str:
        return f"/sandboxes/{quote(self.sandbox_id)}"

    # ------------------------------------------------------------ lifetime

    async def refresh(self) -> models.Sandbox:
        """Fetch the sandbox object again and store it in ``info``."""
        data = await self._client._http.json("GET", self._path, idempotent=True)
        self.info = models.Sandbox.from_json(data)
        return self.info

    async def wait_ready(self, timeout: float = 600) -> models.Sandbox:
        """Wait until ``ready``; ``SandboxFailed`` if it fails, ``SandboxTimeout`` if slow."""
        self.info = await self._client._wait_sandbox(self.sandbox_id, timeout)
        return self.info

    async def heartbeat(self) -> models.Sandbox:
        """Refresh the sandbox's idle timer; returns (and stores) the sandbox object."""
        data = await self._client._http.json("POST", f"{self._path}/heartbeat", idempotent=True)
        self.info = models.Sandbox.from_json(data)
        return self.info

    async def delete(self) -> None:
        """Delete the sandbox (an already deleted one is not an error)."""
        await self._client.delete_sandbox(self.sandbox_id)
        self._deleted = True

    # ------------------------------------------------------------ commands

    def _exec_body(
        self,
        command: str | list[str],
        timeout: float,
        cwd: str | None,
        env: dict[str, str] | None,
        stdin: str | None,
        login_shell: bool,
        wait: bool,
    ) -> dict[str, Any]:
        return models.ExecRequest(
            command=command,
            timeout_seconds=timeout,
            cwd=cwd,
            env=env,
            login_shell=login_shell,
            wait=wait,
            stdin=stdin,
        ).to_json()

    async def exec(
        self,
        command: str | list[str],
        *,
        timeout: float = 300,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
        login_shell: bool = False,
    ) -> models.Job:
        """Run a command to completion and return its job (nonzero exit is not an exception).

        A string runs under ``bash -c``; a list is an argv run without a shell. ``timeout``
        is the server-side kill timer. If the server's own wait ends first (status still
        ``running``), this keeps waiting on ``/jobs/{id}/wait``. Never retried.
        """
        body = self._exec_body(command, timeout, cwd, env, stdin, login_shell, wait=True)
        data = await self._client._http.json(
            "POST", f"{self._path}/exec", json=body, timeout=timeout + 30
        )
        job = models.Job.from_json(data)
        if job.done:
            return job
        # the job is killed after ``timeout`` server-side; allow a grace period on top
        return await self._client._wait_job(job.job_id, time.monotonic() + timeout + 60)

    async def exec_stream(
        self,
        command: str | list[str],
        *,
        timeout: float = 300,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
        login_shell: bool = False,
    ) -> AsyncIterator[models.ExecEvent]:
        """Run a command and yield its output events as they appear, then the ``exit`` event.

        ``stdout``/``stderr`` events carry ``data``; the last event (type ``exit``) carries
        the finished ``job``. Never retried.
        """
        body = self._exec_body(command, timeout, cwd, env, stdin, login_shell, wait=False)
        async with self._client._http.stream(
            "POST", f"{self._path}/exec/stream", json=body, timeout=timeout + 30
        ) as response:
            async for line in response.aiter_lines():
                if line.strip():
                    yield models.ExecEvent.from_json(_json.loads(line))

    async def start(
        self,
        command: str | list[str],
        *,
        timeout: float = 300,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
        login_shell: bool = False,
    ) -> AsyncJobHandle:
        """Start a command in the background and return its job handle at once."""
        body = self._exec_body(command, timeout, cwd, env, stdin, login_shell, wait=False)
        data = await self._client._http.json("POST", f"{self._path}/exec", json=body)
        return AsyncJobHandle(self._client, str(data["job_id"]), self.sandbox_id)

    def job(self, job_id: str) -> AsyncJobHandle:
        """A handle on an existing job of this sandbox, by id (no request is sent)."""
        return AsyncJobHandle(self._client, job_id, self.sandbox_id)

    async def apply_patch(self, patch: str, timeout: float = 30) -> models.PatchResult:
        """Apply a unified diff in the exec cwd (git apply, 3-way, then patch --fuzz)."""
        body = models.ApplyPatchRequest(patch=patch, timeout_seconds=timeout).to_json()
        data = await self._client._http.json(
            "POST", f"{self._path}/apply_patch", json=body, timeout=timeout + 30
        )
        return models.PatchResult.from_json(data)

    # ------------------------------------------------------------ ports

    def port_url(self, port: int, path: str = "") -> str:
        """The service URL that forwards to ``127.0.0.1:<port>/<path>`` inside the sandbox."""
        return f"{self._client.base_url}{self._path}/ports/{int(port)}/{path.lstrip('/')}"

    async def port_request(
        self,
        port: int,
        method: str,
        path: str = "",
        *,
        json: Any = None,
        content: bytes | None = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_bytes: int | None = None,
    ) -> httpx.Response:
        """An HTTP request to ``127.0.0.1:<port>`` inside the sandbox, through the service.

        Returns the sandboxed server's answer whatever its status; an answer longer than
        ``max_bytes`` raises ``PayloadTooLarge`` (what runs in a sandbox is untrusted: bound
        what you read from it). The orchestrator's own errors (unknown sandbox, not ready,
        nothing listening on the port, bad auth) raise their ``OrchardError``. ``path`` may
        not contain ``.`` or ``..`` segments. Sent once, never retried.
        """
        if not 1 <= int(port) <= 65535:
            raise ValueError(f"port must be in 1..65535, not {port}")
        if any(part in (".", "..") for part in path.split("?", 1)[0].split("/")):
            raise ValueError(f"a port path may not contain '.' or '..' segments: {path!r}")
        response = await self._client._http.send_any(
            method.upper(),
            f"{self._path}/ports/{int(port)}/{quote(path.lstrip('/'), safe='/')}",
            json=json,
            params=params,
            content=content,
            headers=headers,
            timeout=timeout,
            max_bytes=max_bytes,
        )
        if response.status_code >= 400 and _is_service_error(response):
            raise error_from_response(response)
        return response

    # ------------------------------------------------------------ files

    async def upload_content(self, remote_path: str, data: bytes | str) -> None:
        """Write bytes (or UTF-8 text) to ``remote_path``; parent directories are created."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        await self._client._http.request(
            "PUT", f"{self._path}/fs", params={"path": remote_path}, content=raw, idempotent=True
        )

    async def upload_file(self, local_path: str | os.PathLike[str], remote_path: str) -> None:
        """Stream a local file to ``remote_path`` as a raw body (no base64, no full read)."""
        source = Path(local_path)

        async def chunks() -> AsyncIterator[bytes]:
            with source.open("rb") as fh:
                while chunk := fh.read(_CHUNK):
                    yield chunk

        await self._client._http.request(
            "PUT",
            f"{self._path}/fs",
            params={"path": remote_path},
            content=chunks,
            idempotent=True,
            timeout=max(self._client._http.timeout, 600),
        )

    async def download_content(self, remote_path: str) -> bytes:
        """The bytes of ``remote_path``."""
        response = await self._client._http.request(
            "GET", f"{self._path}/fs", params={"path": remote_path}, idempotent=True
        )
        return response.content

    async def download_file(self, remote_path: str, local_path: str | os.PathLike[str]) -> None:
        """Stream ``remote_path`` to ``local_path`` (via a temp file renamed when complete)."""
        await self._download_to(remote_path, Path(local_path), {"path": remote_path})

    async def _download_to(self, remote_path: str, target: Path, params: dict[str, str]) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as fh:
                async with self._client._http.stream(
                    "GET", f"{self._path}/fs", params=params, idempotent=True, timeout=600
                ) as response:
                    async for chunk in response.aiter_bytes(_CHUNK):
                        fh.write(chunk)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    async def list_files(self, path: str = ".") -> list[models.FileInfo]:
        """The entries of directory ``path``."""
        data = await self._client._http.json(
            "GET", f"{self._path}/files/list", params={"path": path}, idempotent=True
        )
        return models.FileList.from_json(data).files

    async def upload_dir(self, local_dir: str | os.PathLike[str], remote_dir: str) -> None:
        """Upload a local directory tree into ``remote_dir`` as one tar stream."""
        source = Path(local_dir)
        with tempfile.TemporaryDirectory() as tmpdir:
            archive = Path(tmpdir) / "upload.tar"
            with tarfile.open(archive, "w") as tar:
                for child in sorted(source.iterdir()):
                    tar.add(child, arcname=child.name)

            async def chunks() -> AsyncIterator[bytes]:
                with archive.open("rb") as fh:
                    while chunk := fh.read(_CHUNK):
                        yield chunk

            await self._client._http.request(
                "PUT",
                f"{self._path}/fs",
                params={"path": remote_dir, "archive": "tar"},
                content=chunks,
                idempotent=True,
                timeout=600,
            )

    async def download_dir(self, remote_dir: str, local_dir: str | os.PathLike[str]) -> None:
        """Download directory ``remote_dir`` (a tar stream) and unpack it into ``local_dir``."""
        target = Path(local_dir)
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmpdir:
            archive = Path(tmpdir) / "download.tar"
            await self._download_to(remote_dir, archive, {"path": remote_dir, "archive": "tar"})
            with tarfile.open(archive) as tar:
                tar.extractall(target, filter="data")

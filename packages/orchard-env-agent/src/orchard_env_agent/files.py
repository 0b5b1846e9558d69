"""File routes: base64 JSON files, listings, raw streaming and tar archives."""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import stat
import tarfile
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from . import tarsafe
from .context import SandboxContext
from .errors import ApiError, invalid
from .paths import Resolved, require_exists, require_writable, resolve

CHUNK = 1 << 20


async def resolve_async(ctx: SandboxContext, path: str, follow_last: bool = True) -> Resolved:
    return await anyio.to_thread.run_sync(lambda: resolve(ctx, path, follow_last=follow_last))


def _query_path(request: Request) -> str:
    path = request.query_params.get("path")
    if not path:
        raise ApiError(400, "invalid_path", "the 'path' query parameter is required")
    return path


def _write_atomic(r: Resolved, data: bytes) -> int:
    parent = os.path.dirname(r.host_path) or "/"
    if r.is_dir:
        raise ApiError(400, "is_a_directory", f"{r.sandbox_path!r} is a directory")
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=".orchard-upload-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, r.host_path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return len(data)


def _os_error(r: Resolved | None, exc: OSError) -> ApiError:
    where = r.sandbox_path if r else "?"
    if isinstance(exc, FileNotFoundError):
        return ApiError(404, "path_not_found", f"no such path: {where!r}")
    if isinstance(exc, IsADirectoryError):
        return ApiError(400, "is_a_directory", f"{where!r} is a directory")
    if isinstance(exc, NotADirectoryError):
        return ApiError(400, "not_a_directory", f"{where!r}: a parent is not a directory")
    if isinstance(exc, PermissionError):
        return ApiError(400, "permission_denied", f"{where!r}: permission denied")
    if exc.errno == 30:  # EROFS
        return ApiError(400, "read_only", f"{where!r} is on a read-only file system")
    return ApiError(400, "io_error", f"{where!r}: {exc.strerror or exc}")


async def post_file(ctx: SandboxContext, body: dict[str, Any]) -> Response:
    path, content = body["path"], body["content"]
    try:
        data = base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise invalid("'content' is not valid base64") from None
    r = await resolve_async(ctx, path)
    require_writable(r)
    try:
        size = await anyio.to_thread.run_sync(_write_atomic, r, data)
    except OSError as exc:
        raise _os_error(r, exc) from None
    return JSONResponse({"success": True, "path": r.sandbox_path, "size": size})


def _read(r: Resolved) -> bytes:
    with open(r.host_path, "rb") as fh:
        return fh.read()


async def get_file(ctx: SandboxContext, request: Request) -> Response:
    r = await resolve_async(ctx, _query_path(request))
    require_exists(r)
    if r.is_dir:
        raise ApiError(400, "is_a_directory", f"{r.sandbox_path!r} is a directory")
    try:
        data = await anyio.to_thread.run_sync(_read, r)
    except OSError as exc:
        raise _os_error(r, exc) from None
    return JSONResponse(
        {"path": r.sandbox_path, "content": base64.b64encode(data).decode(), "size": len(data)}
    )


def _list(r: Resolved) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with os.scandir(r.host_path) as it:
        for entry in it:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            kind = (
                "symlink"
                if stat.S_ISLNK(st.st_mode)
                else "directory"
                if stat.S_ISDIR(st.st_mode)
                else "file"
            )
            out.append(
                {"name": entry.name, "type": kind, "size": st.st_size, "modified": st.st_mtime}
            )
    out.sort(key=lambda e: e["name"])
    return out


async def list_files(ctx: SandboxContext, request: Request) -> Response:
    r = await resolve_async(ctx, _query_path(request))
    require_exists(r)
    if not r.is_dir:
        raise ApiError(400, "not_a_directory", f"{r.sandbox_path!r} is not a directory")
    try:
        files = await anyio.to_thread.run_sync(_list, r)
    except OSError as exc:
        raise _os_error(r, exc) from None
    return JSONResponse({"path": r.sandbox_path, "files": files})


# ---- raw streaming -------------------------------------------------------------------


UPLOAD_CAP_HEADER = "x-orchard-upload-cap"


def _upload_cap(request: Request, limit: int) -> int:
    """The agent's cap, or the orchestrator's if it sent a smaller one with the request."""
    raw = request.headers.get(UPLOAD_CAP_HEADER, "")
    return min(limit, int(raw)) if raw.isdigit() else limit


async def _receive_to_temp(request: Request, parent: str, limit: int) -> tuple[str, int]:
    """Stream the request body into a temp file in `parent`; 413 (and no file) past `limit`."""
    limit = _upload_cap(request, limit)
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise ApiError(413, "too_large", f"upload of {length} bytes exceeds the {limit} byte cap")
    fd, tmp = await anyio.to_thread.run_sync(
        lambda: tempfile.mkstemp(dir=parent, prefix=".orchard-upload-")
    )
    fh = os.fdopen(fd, "wb", buffering=0)
    total = 0
    buf = bytearray()
    try:
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise ApiError(413, "too_large", f"upload exceeds the {limit} byte cap")
            buf += chunk
            if len(buf) >= CHUNK:
                data, buf = bytes(buf), bytearray()
                await anyio.to_thread.run_sync(fh.write, data)
        if buf:
            await anyio.to_thread.run_sync(fh.write, bytes(buf))
        fh.close()
    except BaseException as exc:
        fh.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, ClientDisconnect):  # e.g. the orchestrator cut it off at its cap
            raise ApiError(400, "upload_aborted", "the upload ended before its body did") from None
        raise
    return tmp, total


def _extract(tar_path: str, dest: str) -> int:
    """Check every member first (nothing is written if one is refused), then extract."""
    with tarfile.open(tar_path, "r:*") as tf:
        try:
            members = tarsafe.check_members(tf.getmembers(), dest)
        except tarsafe.RefusedMember as exc:
            raise ApiError(400, "path_escape", f"archive member refused: {exc}") from None
        tarsafe.extract(tf, members, dest)
    return len(members)


async def put_fs(ctx: SandboxContext, request: Request, limit: int) -> Response:
    r = await resolve_async(ctx, _query_path(request))
    require_writable(r)
    archive = request.query_params.get("archive")
    try:
        if archive:
            if archive != "tar":
                raise ApiError(400, "invalid_archive", "archive must be 'tar'")
            if r.exists and not r.is_dir:
                raise ApiError(400, "not_a_directory", f"{r.sandbox_path!r} is not a directory")
            await anyio.to_thread.run_sync(lambda: os.makedirs(r.host_path, exist_ok=True))
            tmp, size = await _receive_to_temp(request, r.host_path, limit)
            try:
                count = await anyio.to_thread.run_sync(_extract, tmp, r.host_path)
            except tarfile.TarError as exc:
                raise ApiError(400, "invalid_archive", f"not a readable tar: {exc}") from None
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            return JSONResponse(
                {"success": True, "path": r.sandbox_path, "size": size, "files": count}
            )
        if r.is_dir:
            raise ApiError(400, "is_a_directory", f"{r.sandbox_path!r} is a directory")
        parent = os.path.dirname(r.host_path)
        await anyio.to_thread.run_sync(lambda: os.makedirs(parent, exist_ok=True))
        tmp, size = await _receive_to_temp(request, parent, limit)
        await anyio.to_thread.run_sync(os.replace, tmp, r.host_path)
    except OSError as exc:
        raise _os_error(r, exc) from None
    return JSONResponse({"success": True, "path": r.sandbox_path, "size": size})


async def _file_chunks(fh: Any) -> AsyncIterator[bytes]:
    try:
        while True:
            data = await anyio.to_thread.run_sync(fh.read, CHUNK)
            if not data:
                return
            yield data
    finally:
        fh.close()


class _ChunkWriter:
    """File-like object for tarfile running in a worker thread; sends 1 MiB chunks."""

    def __init__(self, send: Any) -> None:
        self.send = send
        self.buf = bytearray()

    def write(self, data: bytes) -> int:
        self.buf += data
        if len(self.buf) >= CHUNK:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if self.buf:
            data, self.buf = bytes(self.buf), bytearray()
            anyio.from_thread.run(self.send, data)


def _tar_dir(host_dir: str, send: Any) -> None:
    w = _ChunkWriter(send)
    with tarfile.open(fileobj=w, mode="w|", format=tarfile.PAX_FORMAT) as tf:  # type: ignore[call-overload]
        for name in sorted(os.listdir(host_dir)):
            tf.add(os.path.join(host_dir, name), arcname=name, recursive=True)
    w.flush()


async def _tar_chunks(host_dir: str) -> AsyncIterator[bytes]:
    send, receive = anyio.create_memory_object_stream[bytes](4)

    async def produce() -> None:
        async with send:
            await anyio.to_thread.run_sync(_tar_dir, host_dir, send.send)

    async with anyio.create_task_group() as tg, receive:
        tg.start_soon(produce)
        async for chunk in receive:
            yield chunk


async def get_fs(ctx: SandboxContext, request: Request) -> Response:
    r = await resolve_async(ctx, _query_path(request))
    require_exists(r)
    if request.query_params.get("archive"):
        if request.query_params["archive"] != "tar":
            raise ApiError(400, "invalid_archive", "archive must be 'tar'")
        if not r.is_dir:
            raise ApiError(400, "not_a_directory", f"{r.sandbox_path!r} is not a directory")
        return StreamingResponse(_tar_chunks(r.host_path), media_type="application/x-tar")
    if r.is_dir:
        raise ApiError(
            400, "is_a_directory", f"{r.sandbox_path!r} is a directory (use archive=tar)"
        )
    try:
        fh = await anyio.to_thread.run_sync(lambda: open(r.host_path, "rb"))  # noqa: SIM115
        size = os.fstat(fh.fileno()).st_size
    except OSError as exc:
        raise _os_error(r, exc) from None
    return StreamingResponse(
        _file_chunks(fh),
        media_type="application/octet-stream",
        headers={"content-length": str(size)},
    )

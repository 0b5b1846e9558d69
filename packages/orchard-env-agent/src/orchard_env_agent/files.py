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
from .owner import SandboxIO
from .paths import Resolved, require_exists, require_writable, resolve

CHUNK = 1 << 20


async def resolve_async(ctx: SandboxContext, path: str, follow_last: bool = True) -> Resolved:
    return await anyio.to_thread.run_sync(lambda: resolve(ctx, path, follow_last=follow_last))


def _query_path(request: Request) -> str:
    path = request.query_params.get("path")
    if not path:
        raise ApiError(400, "invalid_path", "the 'path' query parameter is required")
    return path


def _write_atomic(target: str, data: bytes) -> int:
    parent = os.path.dirname(target) or "/"
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=".orchard-upload-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
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
    if r.is_dir:
        raise ApiError(400, "is_a_directory", f"{r.sandbox_path!r} is a directory")
    try:
        async with SandboxIO(ctx, r) as io:
            size = await io.run(_write_atomic, io.path(r.host_path), data)
    except OSError as exc:
        raise _os_error(r, exc) from None
    return JSONResponse({"success": True, "path": r.sandbox_path, "size": size})


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


async def get_file(ctx: SandboxContext, request: Request) -> Response:
    r = await resolve_async(ctx, _query_path(request))
    require_exists(r)
    if r.is_dir:
        raise ApiError(400, "is_a_directory", f"{r.sandbox_path!r} is a directory")
    try:
        async with SandboxIO(ctx, r) as io:
            data = await io.run(_read, io.path(r.host_path))
    except OSError as exc:
        raise _os_error(r, exc) from None
    return JSONResponse(
        {"path": r.sandbox_path, "content": base64.b64encode(data).decode(), "size": len(data)}
    )


def _list(path: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with os.scandir(path) as it:
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
        async with SandboxIO(ctx, r) as io:
            files = await io.run(_list, io.path(r.host_path))
    except OSError as exc:
        raise _os_error(r, exc) from None
    return JSONResponse({"path": r.sandbox_path, "files": files})


# ---- raw streaming -------------------------------------------------------------------


UPLOAD_CAP_HEADER = "x-orchard-upload-cap"


def _upload_cap(request: Request, limit: int) -> int:
    """The agent's cap, or the orchestrator's if it sent a smaller one with the request."""
    raw = request.headers.get(UPLOAD_CAP_HEADER, "")
    return min(limit, int(raw)) if raw.isdigit() else limit


async def _receive_to_temp(
    request: Request, io: SandboxIO, parent: str, limit: int
) -> tuple[str, int]:
    """Stream the request body into a temp file in `parent`; 413 (and no file) past `limit`."""
    limit = _upload_cap(request, limit)
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise ApiError(413, "too_large", f"upload of {length} bytes exceeds the {limit} byte cap")
    fd, tmp = await io.run(lambda: tempfile.mkstemp(dir=parent, prefix=".orchard-upload-"))
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
            await io.run(os.unlink, tmp)
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
        async with SandboxIO(ctx, r) as io:
            target = io.path(r.host_path)
            if archive:
                return await _put_archive(request, io, r, target, archive, limit)
            if r.is_dir:
                raise ApiError(400, "is_a_directory", f"{r.sandbox_path!r} is a directory")
            parent = os.path.dirname(target)
            await io.run(lambda: os.makedirs(parent, exist_ok=True))
            tmp, size = await _receive_to_temp(request, io, parent, limit)
            await io.run(os.replace, tmp, target)
    except OSError as exc:
        raise _os_error(r, exc) from None
    return JSONResponse({"success": True, "path": r.sandbox_path, "size": size})


async def _put_archive(
    request: Request, io: SandboxIO, r: Resolved, target: str, archive: str, limit: int
) -> Response:
    if archive != "tar":
        raise ApiError(400, "invalid_archive", "archive must be 'tar'")
    if r.exists and not r.is_dir:
        raise ApiError(400, "not_a_directory", f"{r.sandbox_path!r} is not a directory")
    await io.run(lambda: os.makedirs(target, exist_ok=True))
    tmp, size = await _receive_to_temp(request, io, target, limit)
    try:
        count = await io.run(_extract, tmp, target)
    except tarfile.TarError as exc:
        raise ApiError(400, "invalid_archive", f"not a readable tar: {exc}") from None
    finally:
        with contextlib.suppress(OSError):
            await io.run(os.unlink, tmp)
    return JSONResponse({"success": True, "path": r.sandbox_path, "size": size, "files": count})


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


async def _tar_chunks(ctx: SandboxContext, r: Resolved) -> AsyncIterator[bytes]:
    send, receive = anyio.create_memory_object_stream[bytes](4)
    async with SandboxIO(ctx, r) as io:
        host_dir = io.path(r.host_path)

        async def produce() -> None:
            async with send:
                await io.run(_tar_dir, host_dir, send.send)

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
        return StreamingResponse(_tar_chunks(ctx, r), media_type="application/x-tar")
    if r.is_dir:
        raise ApiError(
            400, "is_a_directory", f"{r.sandbox_path!r} is a directory (use archive=tar)"
        )
    try:
        async with SandboxIO(ctx, r) as io:
            fh = await io.run(open, io.path(r.host_path), "rb")
        size = os.fstat(fh.fileno()).st_size
    except OSError as exc:
        raise _os_error(r, exc) from None
    return StreamingResponse(
        _file_chunks(fh),
        media_type="application/octet-stream",
        headers={"content-length": str(size)},
    )

"""File routes: base64 JSON files, listings, raw streaming and tar archives."""

from __future__ import annotations

import base64
import binascii
import os
import tarfile
import tempfile
from collections.abc import AsyncIterator
from typing import IO, Any

import anyio
import anyio.from_thread
import anyio.to_thread
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from . import anchored, tarsafe
from .context import SandboxContext
from .errors import ApiError, from_os_error, invalid
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


def _os_error(r: Resolved | None, exc: OSError) -> ApiError:
    where = r.sandbox_path if r else "?"
    if isinstance(exc, anchored.NotAFile):
        return ApiError(400, "not_a_file", f"{where!r} {exc.strerror}")
    return from_os_error(exc, where)


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
            size = await io.run(anchored.write_file, io.path, data)
    except OSError as exc:
        raise _os_error(r, exc) from None
    return JSONResponse({"success": True, "path": r.sandbox_path, "size": size})


async def get_file(ctx: SandboxContext, request: Request) -> Response:
    r = await resolve_async(ctx, _query_path(request))
    require_exists(r)
    if r.is_dir:
        raise ApiError(400, "is_a_directory", f"{r.sandbox_path!r} is a directory")
    try:
        async with SandboxIO(ctx, r) as io:
            data = await io.run(anchored.read_file, io.path)
    except OSError as exc:
        raise _os_error(r, exc) from None
    return JSONResponse(
        {"path": r.sandbox_path, "content": base64.b64encode(data).decode(), "size": len(data)}
    )


async def list_files(ctx: SandboxContext, request: Request) -> Response:
    r = await resolve_async(ctx, _query_path(request))
    require_exists(r)
    if not r.is_dir:
        raise ApiError(400, "not_a_directory", f"{r.sandbox_path!r} is not a directory")
    try:
        async with SandboxIO(ctx, r) as io:
            files = await io.run(anchored.list_dir, io.path)
    except OSError as exc:
        raise _os_error(r, exc) from None
    return JSONResponse({"path": r.sandbox_path, "files": files})


# ---- raw streaming -------------------------------------------------------------------


UPLOAD_CAP_HEADER = "x-orchard-upload-cap"


def _upload_cap(request: Request, limit: int) -> int:
    """The agent's cap, or the orchestrator's if it sent a smaller one with the request."""
    raw = request.headers.get(UPLOAD_CAP_HEADER, "")
    return min(limit, int(raw)) if raw.isdigit() else limit


async def _receive(request: Request, out: IO[bytes], limit: int) -> int:
    """Stream the request body into ``out``; 413 past ``limit`` (the caller drops ``out``)."""
    limit = _upload_cap(request, limit)
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise ApiError(413, "too_large", f"upload of {length} bytes exceeds the {limit} byte cap")
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
                await anyio.to_thread.run_sync(out.write, data)
        if buf:
            await anyio.to_thread.run_sync(out.write, bytes(buf))
    except ClientDisconnect:  # e.g. the orchestrator cut it off at its cap
        raise ApiError(400, "upload_aborted", "the upload ended before its body did") from None
    return total


# Where archive members are checked as if extracted: the checks are lexical (no member may
# leave the destination); the extraction itself goes through fds (anchored.extract).
_CHECK_DEST = "/orchard-destination"


def _extract(anchor: int, dest: str, archive: IO[bytes]) -> int:
    """Check every member first (nothing is written if one is refused), then extract."""
    archive.seek(0)
    with tarfile.open(fileobj=archive, mode="r:*") as tf:
        try:
            members = tarsafe.check_members(tf.getmembers(), _CHECK_DEST)
        except tarsafe.RefusedMember as exc:
            raise ApiError(400, "path_escape", f"archive member refused: {exc}") from None
        anchored.extract(anchor, dest, tf, members)
    return len(members)


async def put_fs(ctx: SandboxContext, request: Request, limit: int) -> Response:
    r = await resolve_async(ctx, _query_path(request))
    require_writable(r)
    archive = request.query_params.get("archive")
    try:
        async with SandboxIO(ctx, r) as io:
            if archive:
                return await _put_archive(request, io, r, archive, limit)
            if r.is_dir:
                raise ApiError(400, "is_a_directory", f"{r.sandbox_path!r} is a directory")
            pending = await io.run(anchored.PendingFile, io.path)
            try:
                size = await _receive(request, pending.file, limit)
            except BaseException:
                await io.run(lambda _: pending.discard())
                raise
            await io.run(lambda _: pending.commit())
    except OSError as exc:
        raise _os_error(r, exc) from None
    return JSONResponse({"success": True, "path": r.sandbox_path, "size": size})


async def _put_archive(
    request: Request, io: SandboxIO, r: Resolved, archive: str, limit: int
) -> Response:
    if archive != "tar":
        raise ApiError(400, "invalid_archive", "archive must be 'tar'")
    if r.exists and not r.is_dir:
        raise ApiError(400, "not_a_directory", f"{r.sandbox_path!r} is not a directory")
    await io.run(lambda anchor, path: os.close(anchored.ensure_dir(anchor, path)), io.path)
    # The archive waits in the agent's own temp space, where the sandbox cannot touch it.
    with tempfile.TemporaryFile() as spool:
        size = await _receive(request, spool, limit)
        try:
            count = await io.run(_extract, io.path, spool)
        except tarfile.TarError as exc:
            raise ApiError(400, "invalid_archive", f"not a readable tar: {exc}") from None
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


async def _tar_chunks(ctx: SandboxContext, r: Resolved) -> AsyncIterator[bytes]:
    send, receive = anyio.create_memory_object_stream[bytes](4)
    async with SandboxIO(ctx, r) as io:

        async def produce() -> None:
            async with send:
                await io.run(
                    anchored.tar_tree, io.path, lambda d: anyio.from_thread.run(send.send, d)
                )

        async with anyio.create_task_group() as tg, receive:
            tg.start_soon(produce)
            async for chunk in receive:
                yield chunk


def _open_dir(anchor: int, path: str) -> None:
    os.close(anchored.open_at(anchor, path, os.O_RDONLY | os.O_DIRECTORY))


async def get_fs(ctx: SandboxContext, request: Request) -> Response:
    r = await resolve_async(ctx, _query_path(request))
    require_exists(r)
    if request.query_params.get("archive"):
        if request.query_params["archive"] != "tar":
            raise ApiError(400, "invalid_archive", "archive must be 'tar'")
        if not r.is_dir:
            raise ApiError(400, "not_a_directory", f"{r.sandbox_path!r} is not a directory")
        try:  # an unreadable directory is refused here, before a 200 starts the stream
            async with SandboxIO(ctx, r) as io:
                await io.run(_open_dir, io.path)
        except OSError as exc:
            raise _os_error(r, exc) from None
        return StreamingResponse(_tar_chunks(ctx, r), media_type="application/x-tar")
    if r.is_dir:
        raise ApiError(
            400, "is_a_directory", f"{r.sandbox_path!r} is a directory (use archive=tar)"
        )
    try:
        async with SandboxIO(ctx, r) as io:
            fh = await io.run(anchored.open_file, io.path)
        size = os.fstat(fh.fileno()).st_size
    except OSError as exc:
        raise _os_error(r, exc) from None
    return StreamingResponse(
        _file_chunks(fh),
        media_type="application/octet-stream",
        headers={"content-length": str(size)},
    )

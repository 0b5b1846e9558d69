"""The Starlette app: routes, auth, sandbox selection and error mapping."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from . import __version__, bridges, files, netns, ports
from .build import build_id
from .config import Settings
from .context import Mount, Registry, SandboxContext, normalise_mount_path, single_context
from .errors import ApiError
from .jobs import MAX_FINISHED, Job
from .patch import apply_patch
from .process import REAPER
from .pty import run_pty
from .runner import DEFAULT_TIMEOUT, cancel_job, start_job
from .spawner import spawner_for
from .validate import (
    EXEC_BODY,
    FILE_BODY,
    PATCH_BODY,
    REGISTER_BODY,
    check_body,
)

WAIT_GRACE = 5.0


def error_response(status: int, code: str, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail, "code": code}, status_code=status)


def _bearer(conn: HTTPConnection) -> str | None:
    value = conn.headers.get("authorization", "")
    if value[:7].lower() == "bearer ":
        return value[7:].strip()
    return None


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


class Agent:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.registry = Registry(settings.multi)
        if not settings.multi:
            self.registry.add(single_context(settings.sandbox_id, settings.token))

    # ---- auth --------------------------------------------------------------------
    def sandbox(self, conn: HTTPConnection) -> SandboxContext:
        token = _bearer(conn)
        if not token:
            raise ApiError(401, "unauthorized", "missing bearer token")
        sid = conn.headers.get("x-orchard-sandbox")
        if self.registry.multi:
            if not sid:
                raise ApiError(404, "sandbox_not_found", "X-Orchard-Sandbox header is required")
            ctx = self.registry.get(sid)
            if ctx is None:
                raise ApiError(404, "sandbox_not_found", f"no sandbox {sid!r} here")
        else:
            ctx = self.registry.only()
            if sid and sid != ctx.sandbox_id:
                raise ApiError(404, "sandbox_not_found", f"no sandbox {sid!r} here")
        if not _same(token, ctx.token):
            raise ApiError(401, "unauthorized", "invalid token")
        return ctx

    def admin(self, conn: HTTPConnection) -> None:
        if not self.registry.multi:
            raise ApiError(404, "not_found", "the admin API exists only in multi mode")
        token = _bearer(conn)
        if not token or not _same(token, self.settings.admin_token):
            raise ApiError(401, "unauthorized", "missing or invalid admin token")

    def job(self, ctx: SandboxContext, job_id: str) -> Job:
        job = ctx.jobs.get(job_id)
        if job is None and ctx.jobs.was_evicted(job_id):
            raise ApiError(
                404,
                "job_evicted",
                f"job {job_id!r} finished, and its result was dropped: the agent keeps the "
                f"last {MAX_FINISHED} finished jobs of a sandbox (fetch results sooner)",
            )
        if job is None:
            raise ApiError(404, "job_not_found", f"no job {job_id!r}")
        return job

    # ---- routes ------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ok",
                "version": __version__,
                "mode": "multi" if self.registry.multi else "single",
                "sandboxes": len(self.registry.sandboxes),
                "build": build_id(),
                "jobs_running": sum(len(c.jobs.running) for c in self.registry.sandboxes.values()),
            }
        )

    def _start(self, ctx: SandboxContext, body: dict[str, Any], listen: Any = None) -> Job:
        return start_job(
            ctx,
            body["command"],
            cap=self.settings.max_output_bytes,
            timeout=body.get("timeout_seconds"),
            cwd=body.get("cwd"),
            env=body.get("env"),
            login_shell=body.get("login_shell", False),
            stdin=body.get("stdin"),
            listen=listen,
            job_id=body.get("job_id"),
        )

    async def exec(self, request: Request) -> Response:
        ctx = self.sandbox(request)
        body = check_body(await request.body(), EXEC_BODY)
        job = self._start(ctx, body)
        if not body.get("wait"):
            return JSONResponse({"job_id": job.job_id, "status": "queued"})
        limit = body.get("timeout_seconds", DEFAULT_TIMEOUT) or DEFAULT_TIMEOUT
        if not job.finished:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(job.done.wait(), limit + WAIT_GRACE)
        return JSONResponse(job.to_dict())

    async def exec_stream(self, request: Request) -> Response:
        ctx = self.sandbox(request)
        body = check_body(await request.body(), EXEC_BODY)
        body.pop("wait", None)
        queue: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue()
        job = self._start(ctx, body, listen=queue)

        async def events() -> AsyncIterator[bytes]:
            try:
                while True:
                    item = await queue.get()
                    if item is None:
                        break
                    parts = [item]
                    while not queue.empty():  # coalesce what is already there
                        nxt = queue.get_nowait()
                        if nxt is None:
                            queue.put_nowait(None)
                            break
                        parts.append(nxt)
                    yield "".join(
                        json.dumps({"type": s, "data": d}, ensure_ascii=False) + "\n"
                        for s, d in parts
                    ).encode()
                yield (json.dumps({"type": "exit", **job.to_dict()}) + "\n").encode()
            finally:
                if not job.finished:  # the client went away: do not leak the process
                    cancel_job(job)

        return StreamingResponse(events(), media_type="application/x-ndjson")

    async def get_job(self, request: Request) -> Response:
        ctx = self.sandbox(request)
        return JSONResponse(self.job(ctx, request.path_params["job_id"]).to_dict())

    async def wait_job(self, request: Request) -> Response:
        ctx = self.sandbox(request)
        job = self.job(ctx, request.path_params["job_id"])
        raw = request.query_params.get("timeout", "30")
        try:
            timeout = min(max(float(raw), 0.0), 3600.0)
        except ValueError:
            raise ApiError(
                400, "invalid_timeout", f"timeout must be a number, not {raw!r}"
            ) from None
        if not job.finished:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(job.done.wait(), timeout)
        return JSONResponse(job.to_dict())

    async def cancel(self, request: Request) -> Response:
        ctx = self.sandbox(request)
        job = self.job(ctx, request.path_params["job_id"])
        if not job.finished:
            cancel_job(job)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(job.done.wait(), 5)
        return JSONResponse(job.to_dict())

    async def apply_patch(self, request: Request) -> Response:
        ctx = self.sandbox(request)
        body = check_body(await request.body(), PATCH_BODY)
        result = await apply_patch(
            ctx,
            body["patch"],
            float(body.get("timeout_seconds", 30) or 30),
            self.settings.max_output_bytes,
        )
        return JSONResponse(result)

    async def files_post(self, request: Request) -> Response:
        ctx = self.sandbox(request)
        body = check_body(await request.body(), FILE_BODY)
        return await files.post_file(ctx, body)

    async def files_get(self, request: Request) -> Response:
        return await files.get_file(self.sandbox(request), request)

    async def files_list(self, request: Request) -> Response:
        return await files.list_files(self.sandbox(request), request)

    async def fs_put(self, request: Request) -> Response:
        return await files.put_fs(self.sandbox(request), request, self.settings.max_upload_bytes)

    async def fs_get(self, request: Request) -> Response:
        return await files.get_fs(self.sandbox(request), request)

    async def ports(self, request: Request) -> Response:
        ctx = self.sandbox(request)
        return await ports.forward(
            ctx, request, request.path_params["port"], request.path_params.get("path", "")
        )

    async def bridges_configure(self, request: Request) -> Response:
        return await bridges.configure_route(self.sandbox(request), request)

    async def bridges_next(self, request: Request) -> Response:
        return await bridges.next_route(self.sandbox(request), request)

    async def bridges_answer(self, request: Request) -> Response:
        return await bridges.answer_route(self.sandbox(request), request)

    async def _ws_sandbox(self, ws: WebSocket) -> SandboxContext | None:
        """The upgrade's sandbox, or None after closing the socket with why not."""
        try:
            return self.sandbox(ws)
        except ApiError as exc:
            await ws.close(code=4401 if exc.status == 401 else 4404, reason=exc.detail[:120])
            return None

    async def ports_ws(self, ws: WebSocket) -> None:
        ctx = await self._ws_sandbox(ws)
        if ctx is None:
            return
        await ports.forward_websocket(
            ctx, ws, ws.path_params["port"], ws.path_params.get("path", "")
        )

    async def pty(self, ws: WebSocket) -> None:
        ctx = await self._ws_sandbox(ws)
        if ctx is not None:
            await run_pty(ctx, ws)

    # ---- admin -------------------------------------------------------------------
    async def admin_register(self, request: Request) -> Response:
        self.admin(request)
        body = check_body(await request.body(), REGISTER_BODY)
        mounts = [
            Mount(normalise_mount_path(m["path"]), m["host_path"], bool(m.get("writable", True)))
            for m in body.get("mounts", [])
        ]
        ctx = SandboxContext(
            sandbox_id=body["sandbox_id"],
            token=body["token"],
            env=body.get("env", {}),
            workdir=body.get("workdir") or "/workspace",
            holder_pid=body.get("holder_pid"),
            mounts=mounts,
            cgroup_procs=body.get("cgroup_procs", []),
            owner=tuple(body["owner"]) if "owner" in body else None,
            user=tuple(body["user"]) if "user" in body else None,
        )
        self.registry.add(ctx)
        if ctx.holder_pid is not None:
            # Its spawner starts once the answer is out: off the create's path, and ready
            # (or on its way) by the first command.
            asyncio.get_running_loop().call_soon(self._start_spawner, ctx)
        return JSONResponse({"sandbox_id": ctx.sandbox_id, "status": "registered"}, 201)

    def _start_spawner(self, ctx: SandboxContext) -> None:
        if self.registry.get(ctx.sandbox_id) is ctx:
            spawner_for(ctx)

    async def admin_delete(self, request: Request) -> Response:
        self.admin(request)
        sid = request.path_params["sandbox_id"]
        ctx = self.registry.remove(sid)
        if ctx is None:
            raise ApiError(404, "sandbox_not_found", f"no sandbox {sid!r} here")
        ctx.stop_commands()
        await ctx.bridges.close()
        return JSONResponse({"status": "deleted", "sandbox_id": sid})

    async def admin_list(self, request: Request) -> Response:
        self.admin(request)
        return JSONResponse(
            {
                "sandboxes": [
                    {"sandbox_id": c.sandbox_id, "running_jobs": len(c.jobs.running)}
                    for c in self.registry.sandboxes.values()
                ]
            }
        )


class RequestIdMiddleware:
    """Echo X-Request-ID (pure ASGI: no per-request task like BaseHTTPMiddleware)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = None
        for k, v in scope["headers"]:
            if k == b"x-request-id":
                rid = v
                break
        if rid is None:
            await self.app(scope, receive, send)
            return

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid)]
            await send(message)

        await self.app(scope, receive, send_with_id)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.detail)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail))


async def _internal(request: Request, exc: Exception) -> Response:
    return error_response(500, "internal", f"internal error: {exc!r}")


def create_app(settings: Settings) -> Starlette:
    build_id()  # of the code this process starts with, whatever is installed later
    agent = Agent(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        REAPER.install(asyncio.get_running_loop())
        netns.remember_own_netns()
        yield
        for ctx in agent.registry.sandboxes.values():
            ctx.stop_commands()

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    routes = [
        Route("/health", agent.health, methods=["GET"]),
        Route("/exec", agent.exec, methods=["POST"]),
        Route("/exec/stream", agent.exec_stream, methods=["POST"]),
        WebSocketRoute("/exec/pty", agent.pty),
        Route("/jobs/{job_id}", agent.get_job, methods=["GET"]),
        Route("/jobs/{job_id}/wait", agent.wait_job, methods=["GET"]),
        Route("/jobs/{job_id}/cancel", agent.cancel, methods=["POST"]),
        Route("/apply_patch", agent.apply_patch, methods=["POST"]),
        Route("/files", agent.files_post, methods=["POST"]),
        Route("/files", agent.files_get, methods=["GET"]),
        Route("/files/list", agent.files_list, methods=["GET"]),
        Route("/fs", agent.fs_put, methods=["PUT"]),
        Route("/fs", agent.fs_get, methods=["GET"]),
        Route("/ports/{port:int}/{path:path}", agent.ports, methods=methods),
        Route("/ports/{port:int}", agent.ports, methods=methods),
        WebSocketRoute("/ports/{port:int}/{path:path}", agent.ports_ws),
        Route("/bridges", agent.bridges_configure, methods=["POST"]),
        Route("/bridges/next", agent.bridges_next, methods=["GET"]),
        Route("/bridges/{request_id}/response", agent.bridges_answer, methods=["POST"]),
        Route("/_admin/sandboxes", agent.admin_register, methods=["POST"]),
        Route("/_admin/sandboxes", agent.admin_list, methods=["GET"]),
        Route("/_admin/sandboxes/{sandbox_id}", agent.admin_delete, methods=["DELETE"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
            Exception: _internal,
        },
    )
    app.state.agent = agent
    app.add_middleware(RequestIdMiddleware)
    return app

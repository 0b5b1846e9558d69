"""The FastAPI application: wiring of settings, backend, service and routes."""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import __version__
from .agent_client import AgentClient
from .auth import require_tenant
from .backends import Backend, make_backend
from .backends.base import BackendUnavailable
from .errors import error_response, install_error_handlers
from .exec_fast_path import ExecFastPath
from .metrics import REGISTRY
from .middleware import RequestContextMiddleware
from .routes import exec as exec_routes
from .routes import files, ports, sandboxes
from .schemas import ErrorBody, Health
from .service import SandboxService
from .settings import Settings

log = logging.getLogger("orchard_env_server")

# FastAPI >= 0.16x instruments every request for OpenTelemetry (a provider lookup per
# request, ~3% of the orchestrator's loop under load); the service exports Prometheus
# metrics instead, so it is turned off where the option exists.
_NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 404, 408, 409, 413, 422, 429, 503)
}


def create_app(settings: Settings | None = None, backend: Backend | None = None) -> FastAPI:
    """Build the service; the backend is chosen from the settings unless given."""
    settings = settings or Settings.from_env()
    backend = backend or make_backend(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.agents = AgentClient()
        service = SandboxService(settings, backend, app.state.agents)
        await service.start()
        app.state.service = service
        for warning in backend.info().warnings:
            log.warning(warning)
        try:
            yield
        finally:
            await service.close()
            await app.state.agents.aclose()

    app = FastAPI(
        title="Orchard Env",
        version=__version__,
        description="Self-hostable sandbox service for agent training and evaluation.",
        lifespan=lifespan,
        responses=_ERRORS,
        **_NO_TELEMETRY,
    )
    app.state.settings = settings
    app.state.backend = backend
    install_error_handlers(app)

    async def on_backend_unavailable(_: Request, exc: Exception) -> Response:
        return error_response(503, "backend_unavailable", str(exc), {"Retry-After": "2"})

    app.add_exception_handler(BackendUnavailable, on_backend_unavailable)
    if settings.exec_fast_path:
        app.add_middleware(ExecFastPath)  # inside the request context: ids, logs, metrics
    app.add_middleware(RequestContextMiddleware)

    @app.get("/", tags=["service"])
    async def banner() -> dict[str, str]:
        return {"name": "orchard-env", "version": __version__, "backend": backend.name}

    @app.get("/health", response_model=Health, tags=["service"])
    async def health() -> Health:
        info = backend.info()
        return Health(
            status="ok",
            backend=backend.name,
            version=__version__,
            isolation=info.isolation,
            isolation_details=info.isolation_details,
            warnings=info.warnings,
        )

    @app.get("/resources", tags=["service"])
    async def resources(request: Request) -> JSONResponse:
        require_tenant(request)
        data = (await backend.resources()).to_json()
        data["sandboxes_known"] = request.app.state.service.count()
        data["sandboxes_reaping"] = request.app.state.service.reaping()
        data["warm_pools"] = request.app.state.service.pool_stats()
        return JSONResponse(data)

    @app.get("/metrics", tags=["service"], response_class=PlainTextResponse)
    async def metrics_text(request: Request) -> Response:
        require_tenant(request)
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    for module in (sandboxes, exec_routes, files, ports):
        app.include_router(module.router)
    return app

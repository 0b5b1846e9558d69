"""The one place where failures become HTTP statuses and JSON error bodies."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

log = logging.getLogger("orchard_env_server")


class ApiError(Exception):
    """An error the client can act on: status, machine code and human detail."""

    def __init__(
        self, status: int, code: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers or {}


def bad_request(detail: str, code: str = "bad_request") -> ApiError:
    return ApiError(400, code, detail)


def unauthorized(detail: str = "missing or invalid API key") -> ApiError:
    return ApiError(401, "unauthorized", detail, {"WWW-Authenticate": "Bearer"})


def sandbox_not_found(sandbox_id: str) -> ApiError:
    return ApiError(404, "sandbox_not_found", f"sandbox {sandbox_id!r} not found")


def job_not_found(job_id: str) -> ApiError:
    return ApiError(404, "job_not_found", f"job {job_id!r} not found")


def wait_timeout(detail: str) -> ApiError:
    return ApiError(408, "timeout", detail)


def conflict(detail: str, code: str = "conflict") -> ApiError:
    return ApiError(409, code, detail)


def too_large(detail: str) -> ApiError:
    return ApiError(413, "too_large", detail)


def quota_exceeded(detail: str) -> ApiError:
    return ApiError(429, "quota_exceeded", detail, {"Retry-After": "5"})


def overloaded(detail: str, retry_after: int = 1) -> ApiError:
    return ApiError(503, "overloaded", detail, {"Retry-After": str(retry_after)})


def backend_unavailable(detail: str) -> ApiError:
    return ApiError(503, "backend_unavailable", detail, {"Retry-After": "2"})


_IMAGE_ERRORS = {
    "not_found": (404, "image_not_found"),
    "pull_failed": (502, "image_pull_failed"),
    "invalid": (400, "invalid_image"),
}


def image_unavailable(reason: str, detail: str) -> ApiError:
    """A create whose image cannot be had (see ``backends.base.ImageUnavailable``)."""
    status, code = _IMAGE_ERRORS.get(reason, (400, "invalid_image"))
    return ApiError(status, code, detail)


def error_response(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"detail": detail, "code": code}, status_code=status, headers=headers)


_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    408: "timeout",
    409: "conflict",
    413: "too_large",
    422: "invalid_body",
    429: "quota_exceeded",
    503: "overloaded",
}


def _describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{where or 'body'}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def _too_long_path(exc: RequestValidationError) -> bool:
    """Whether a sandbox file path over the schema's length is what failed."""
    errors = exc.errors()
    return bool(errors) and all(
        err.get("type") == "string_too_long" and tuple(err.get("loc", ()))[-1:] == ("path",)
        for err in errors
    )


_CONSTRAINTS = {"string_pattern_mismatch", "string_too_long", "too_long"}


def _bridge_errors(exc: RequestValidationError) -> str | None:
    """What is wrong with a create's ``bridges``, when that is all that is (the schema's
    port and URL rules): a 400 ``invalid_bridge`` like the checks ``bridges.py`` makes."""
    errors = exc.errors()
    said: list[str] = []
    for err in errors:
        loc = tuple(err.get("loc", ()))
        if loc[:2] != ("body", "bridges") or err.get("type") not in _CONSTRAINTS:
            return None
        if len(loc) == 2:
            said.append("at most 16 bridges")
        elif loc[-1] == "[key]":
            said.append(f"bridge port {str(loc[2])[:20]!r} is not a port number (1..65535)")
        else:
            said.append(
                f"bridge {loc[2]}: the upstream must be an http or https URL of at most 2048 "
                "characters, its host a name, an IPv4 or a bracketed IPv6 address, without "
                "credentials, query, fragment or . and .. segments (nor escapes of them)"
            )
    return "; ".join(said[:5]) if said else None


def _allowed_methods(request: Request) -> str:
    """Every method the API serves at this path. Starlette's 405 names only the methods
    of the first route that matched the path, but FastAPI has one route per method (GET
    and POST /sandboxes are two routes); the OpenAPI paths list them all."""
    app: FastAPI = request.app
    path = request.scope.get("path", "")
    methods: set[str] = set()
    for template, operations in app.openapi().get("paths", {}).items():
        if compile_path(template)[0].match(path):
            methods |= {method.upper() for method in operations}
    return ", ".join(sorted(methods))


def install_error_handlers(app: FastAPI) -> None:
    """Map every exception type to ``{"detail", "code"}`` with the right status."""

    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.code, exc.detail, exc.headers)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        if _too_long_path(exc):  # what the agent answers for a path the kernel refuses
            return error_response(400, "invalid_path", _describe_validation(exc))
        bridges = _bridge_errors(exc)
        if bridges is not None:
            return error_response(400, "invalid_bridge", bridges)
        return error_response(422, "invalid_body", _describe_validation(exc))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = _STATUS_CODES.get(exc.status_code, "error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(request) or headers.get("Allow", "")
        return error_response(exc.status_code, code, str(exc.detail), headers)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", f"internal error: {type(exc).__name__}")

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)

"""Exceptions of the client: one class per failure a caller can act on.

``error_from_response`` is the ONE place that maps an HTTP answer to an exception: first by
the body's machine ``code`` (``sandbox_not_found``, ...), then by status. Every exception
carries ``status``, ``code``, ``request_id`` (from ``X-Request-ID``) and the body's
``detail``, and all derive from ``OrchardError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from .models import Sandbox

__all__ = [
    "AuthError",
    "BadRequest",
    "Conflict",
    "ConnectionFailed",
    "JobNotFound",
    "NotFound",
    "OrchardError",
    "Overloaded",
    "PathNotFound",
    "PayloadTooLarge",
    "QuotaExceeded",
    "SandboxFailed",
    "SandboxNotFound",
    "SandboxNotReady",
    "SandboxTimeout",
    "ServerError",
    "ValidationError",
    "error_from_response",
]


class OrchardError(Exception):
    """Base of every client error.

    Attributes: ``message`` (human text), ``status`` (HTTP status or ``None`` when no answer
    came), ``code`` (the server's machine code), ``request_id`` and ``detail`` (the body's
    ``detail`` as sent, which may be structured for 422).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        request_id: str | None = None,
        detail: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.request_id = request_id
        self.detail = detail

    def __str__(self) -> str:
        parts = [self.message]
        if self.status is not None:
            parts.append(f"status={self.status}")
        if self.code:
            parts.append(f"code={self.code}")
        if self.request_id:
            parts.append(f"request_id={self.request_id}")
        return parts[0] if len(parts) == 1 else f"{parts[0]} ({', '.join(parts[1:])})"


class BadRequest(OrchardError):
    """400: the request makes no sense to the server."""


class AuthError(OrchardError):
    """401: the API key is missing or invalid."""


class NotFound(OrchardError):
    """404: an unknown sandbox, job or path (another tenant's id also answers 404)."""


class SandboxNotFound(NotFound):
    """404 ``sandbox_not_found``: the sandbox does not exist (or is gone)."""


class JobNotFound(NotFound):
    """404 ``job_not_found``: the job does not exist."""


class PathNotFound(NotFound):
    """404 ``path_not_found``: the file or directory does not exist in the sandbox."""


class SandboxTimeout(OrchardError):
    """408, or a client-side wait that ran out: the sandbox or job was not done in time."""


class Conflict(OrchardError):
    """409: the id is taken, or the sandbox is not ready / already gone."""


class SandboxNotReady(Conflict):
    """409 ``sandbox_not_ready``: the sandbox cannot take this request yet."""


class PayloadTooLarge(OrchardError):
    """413: the body or file is above the server's size cap (nothing was written)."""


class ValidationError(OrchardError):
    """422: the request body failed validation (e.g. an unknown field)."""


class QuotaExceeded(OrchardError):
    """429: the tenant's quota is reached; delete sandboxes or wait."""


class Overloaded(OrchardError):
    """503: the server is overloaded or its backend is down; safe to retry after ``retry_after``."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class ServerError(OrchardError):
    """Any other 5xx (or an unexpected status): a server-side bug or a proxy failure."""


class ConnectionFailed(OrchardError):
    """No HTTP answer: connection refused/reset or a transport timeout (after retries)."""


class SandboxFailed(OrchardError):
    """The sandbox reached status ``failed`` while being created; ``sandbox`` holds its info."""

    def __init__(self, message: str, *, sandbox: Sandbox | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.sandbox = sandbox


_BY_CODE: dict[str, type[OrchardError]] = {
    "sandbox_not_found": SandboxNotFound,
    "job_not_found": JobNotFound,
    "job_evicted": JobNotFound,  # it finished; the agent has dropped its result since
    "path_not_found": PathNotFound,
    "sandbox_not_ready": SandboxNotReady,
}

_BY_STATUS: dict[int, type[OrchardError]] = {
    400: BadRequest,
    401: AuthError,
    403: AuthError,
    404: NotFound,
    408: SandboxTimeout,
    409: Conflict,
    413: PayloadTooLarge,
    422: ValidationError,
    429: QuotaExceeded,
    503: Overloaded,
}


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds form only), else ``None``."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def error_from_response(response: httpx.Response, request_id: str | None = None) -> OrchardError:
    """The exception for an error answer (status >= 400); its body must already be read."""
    status = response.status_code
    code: str | None = None
    detail: Any = None
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        detail = body.get("detail")
        raw_code = body.get("code")
        code = raw_code if isinstance(raw_code, str) else None
    if isinstance(detail, str):
        message = detail
    elif detail is not None:
        message = str(detail)
    else:
        message = response.text.strip() or response.reason_phrase or f"HTTP {status}"
    cls = _BY_CODE.get(code or "")
    if cls is None or _BY_STATUS.get(status) not in (cls, *cls.__mro__):
        cls = _BY_STATUS.get(status, ServerError if status >= 500 else OrchardError)
    kw: dict[str, Any] = {
        "status": status,
        "code": code,
        "request_id": response.headers.get("x-request-id") or request_id,
        "detail": detail,
    }
    if cls is Overloaded:
        return Overloaded(
            message, retry_after=parse_retry_after(response.headers.get("retry-after")), **kw
        )
    return cls(message, **kw)

"""API keys to tenants. With no keys configured, auth is off and everyone is ``default``."""

from __future__ import annotations

import hmac

from starlette.requests import HTTPConnection

from .errors import unauthorized

DEFAULT_TENANT = "default"


def presented_key(request: HTTPConnection) -> str | None:
    """The API key sent as ``X-API-Key`` or ``Authorization: Bearer``, if any (one pass
    over the raw headers: this runs on every request)."""
    key = bearer = None
    for name, value in request.scope["headers"]:
        if name == b"x-api-key" and key is None:
            key = value
        elif name == b"authorization" and bearer is None:
            bearer = value
    if key:
        return key.decode("latin-1")
    scheme, _, token = (bearer or b"").decode("latin-1").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def tenant_for(keys: dict[str, str], key: str | None) -> str:
    """The tenant a key belongs to (compared in constant time), or 401."""
    if not keys:
        return DEFAULT_TENANT
    if key is None:
        raise unauthorized("this service needs an API key: send X-API-Key or Authorization: Bearer")
    tenant = None
    for known, name in keys.items():
        if hmac.compare_digest(known.encode(), key.encode()):
            tenant = name
    if tenant is None:
        raise unauthorized("invalid API key")
    return tenant


def require_tenant(request: HTTPConnection) -> str:
    """The caller's tenant (401 when keys are set and none valid is presented); kept in
    ``request.state`` for the access log."""
    keys = request.app.state.settings.api_keys
    tenant = tenant_for(keys, presented_key(request)) if keys else DEFAULT_TENANT
    request.state.tenant = tenant
    return tenant

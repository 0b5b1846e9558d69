"""API keys to tenants. With no keys configured, auth is off and everyone is ``default``."""

from __future__ import annotations

import hmac

from fastapi import Request

from .errors import unauthorized

DEFAULT_TENANT = "default"


def presented_key(request: Request) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key
    auth = request.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


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


async def require_tenant(request: Request) -> str:
    """FastAPI dependency: the caller's tenant."""
    tenant = tenant_for(request.app.state.settings.api_keys, presented_key(request))
    request.state.tenant = tenant
    return tenant

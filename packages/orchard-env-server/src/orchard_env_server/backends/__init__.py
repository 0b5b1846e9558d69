"""Sandbox backends: each module holds one; ``make_backend`` picks by name."""

from __future__ import annotations

from ..settings import Settings
from .base import Backend, BackendError

__all__ = ["Backend", "BackendError", "make_backend"]


def make_backend(settings: Settings) -> Backend:
    """Build the backend named in the settings."""
    if settings.backend == "local":
        from .local import LocalBackend

        return LocalBackend(settings)
    raise ValueError(f"unknown backend {settings.backend!r} (available: local)")

"""Sandbox backends: each module holds one; ``make_backend`` picks by name."""

from __future__ import annotations

from ..settings import Settings
from .base import Backend, BackendError

__all__ = ["BACKENDS", "Backend", "BackendError", "make_backend"]

BACKENDS = ("local", "docker")


def make_backend(settings: Settings) -> Backend:
    """Build the backend named in the settings."""
    if settings.backend == "local":
        from .local import LocalBackend

        return LocalBackend(settings)
    if settings.backend == "docker":
        from .docker import DockerBackend

        return DockerBackend(settings)
    raise ValueError(f"unknown backend {settings.backend!r} (available: {', '.join(BACKENDS)})")

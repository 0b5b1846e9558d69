"""Sandbox backends: each module holds one; ``make_backend`` picks by name."""

from __future__ import annotations

from ..settings import Settings
from .base import Backend, BackendError, SandboxRegistry

__all__ = ["BACKENDS", "Backend", "BackendError", "SandboxRegistry", "make_backend"]

BACKENDS = ("local", "docker", "kubernetes")


def make_backend(settings: Settings) -> Backend:
    """Build the backend named in the settings."""
    if settings.backend == "local":
        from .local import LocalBackend

        return LocalBackend(settings)
    if settings.backend == "docker":
        from .docker import DockerBackend

        return DockerBackend(settings)
    if settings.backend == "kubernetes":
        try:
            from .kubernetes import KubernetesBackend
        except ImportError as exc:  # pragma: no cover - the dependency is declared
            raise ValueError(f"the kubernetes backend needs the kubernetes package: {exc}") from exc
        return KubernetesBackend(settings)
    raise ValueError(f"unknown backend {settings.backend!r} (available: {', '.join(BACKENDS)})")

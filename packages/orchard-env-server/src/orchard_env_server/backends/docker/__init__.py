"""The Docker backend: one container per sandbox on a Docker engine."""

from __future__ import annotations

from .backend import DockerBackend

__all__ = ["DockerBackend"]

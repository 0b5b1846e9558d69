"""The Kubernetes backend: one Pod per sandbox, served straight at its pod IP."""

from __future__ import annotations

from .backend import KubernetesBackend

__all__ = ["KubernetesBackend"]

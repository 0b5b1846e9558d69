"""The local backend: sandboxes as bubblewrap namespaces on this machine, no daemon."""

from __future__ import annotations

from .backend import LocalBackend

__all__ = ["LocalBackend"]

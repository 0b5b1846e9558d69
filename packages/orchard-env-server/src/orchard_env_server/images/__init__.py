"""The local backend's image store: pull from registries, import archives, unpack once.

See docs/images.md. ``ImageStore(<state_dir>/image-store)`` is the entry point; its
methods block (the server calls them in a thread).
"""

from __future__ import annotations

from .errors import BadImage, ImageError, ImageNotFound, InvalidReference, RegistryError
from .model import ImageConfig, ProgressCallback, StoredImage
from .reference import Reference, normalize_reference, parse_reference
from .store import ImageStore

__all__ = [
    "BadImage",
    "ImageConfig",
    "ImageError",
    "ImageNotFound",
    "ImageStore",
    "InvalidReference",
    "ProgressCallback",
    "Reference",
    "RegistryError",
    "StoredImage",
    "normalize_reference",
    "parse_reference",
]

"""The image store's errors: each carries the machine ``code`` a caller can map to a status."""

from __future__ import annotations


class ImageError(Exception):
    """Base of the image store's errors."""

    code = "image_error"


class ImageNotFound(ImageError):
    """No such image: not in the store, or not in its registry (or not for this platform)."""

    code = "image_not_found"


class RegistryError(ImageError):
    """A registry cannot be reached or refused a request (its own message is kept)."""

    code = "registry_error"


class BadImage(ImageError):
    """A malformed manifest, config or archive, a digest mismatch, or a hostile layer."""

    code = "bad_image"


class InvalidReference(ImageError, ValueError):
    """A string that is not an image reference (``Upper/Case``, ``a::b``, ``/path``)."""

    code = "invalid_reference"

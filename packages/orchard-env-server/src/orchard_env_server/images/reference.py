"""Image references, normalized as Docker does: ``python:3.11-slim`` is
``docker.io/library/python:3.11-slim``; no tag and no digest means ``:latest``."""

from __future__ import annotations

import re

import attrs

from .errors import InvalidReference

DOCKER_HUB = "docker.io"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?")
_PATH_PART = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@attrs.frozen
class Reference:
    """A parsed, normalized reference: ``registry/repository[:tag][@digest]``."""

    registry: str  # "docker.io", "127.0.0.1:5000"
    repository: str  # "library/python"
    tag: str | None
    digest: str | None  # "sha256:<hex>"

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    def __str__(self) -> str:
        return (
            self.name
            + (f":{self.tag}" if self.tag else "")
            + (f"@{self.digest}" if self.digest else "")
        )


def parse_reference(ref: str) -> Reference:
    """``ref`` parsed and normalized; raises ``InvalidReference`` for anything else."""
    text = ref.strip()
    if not text or len(text) > 512:
        raise InvalidReference(f"{ref!r} is not an image reference")
    digest = None
    if "@" in text:
        text, digest = text.rsplit("@", 1)
        if not DIGEST.fullmatch(digest):
            raise InvalidReference(f"{ref!r}: a digest is sha256: and 64 lowercase hex digits")
    tag = None
    slash = text.rfind("/")
    colon = text.rfind(":")
    if colon > slash:
        text, tag = text[:colon], text[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise InvalidReference(f"{ref!r}: invalid tag {tag!r}")
    first, sep, rest = text.partition("/")
    if sep and (any(c in first for c in ".:") or first == "localhost" or first != first.lower()):
        registry, path = first, rest
        if not _DOMAIN.fullmatch(registry):
            raise InvalidReference(f"{ref!r}: invalid registry {registry!r}")
        if registry == "index.docker.io":
            registry = DOCKER_HUB
    else:
        registry, path = DOCKER_HUB, text
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not path or not all(_PATH_PART.fullmatch(part) for part in path.split("/")):
        raise InvalidReference(
            f"{ref!r}: a repository name is lowercase letters, digits and . _ - separators"
        )
    if len(f"{registry}/{path}") > 255:
        raise InvalidReference(f"{ref!r}: the name is longer than 255 characters")
    if tag is None and digest is None:
        tag = "latest"
    return Reference(registry, path, tag, digest)


def normalize_reference(ref: str) -> str:
    """The normalized string of ``ref`` (``python`` -> ``docker.io/library/python:latest``)."""
    return str(parse_reference(ref))

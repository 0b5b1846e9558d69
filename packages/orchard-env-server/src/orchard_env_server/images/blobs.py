"""Content-addressed blobs: ``blobs/sha256/<hex>``, each checked against its digest before
it is given its name (a blob under its name is never partial and never wrong)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Protocol

from .errors import BadImage
from .model import ProgressCallback

CHUNK = 1 << 20


class Readable(Protocol):
    def read(self, n: int = ..., /) -> bytes: ...


def sha256_hex(digest: str) -> str:
    return digest.split(":", 1)[1]


class Blobs:
    """The blob directory of a store; ``tmp`` is where blobs are written before they are named."""

    def __init__(self, root: Path, tmp: Path) -> None:
        self.dir = root / "sha256"
        self.tmp = tmp
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def path(self, digest: str) -> Path:
        return self.dir / sha256_hex(digest)

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def read(self, digest: str) -> bytes:
        try:
            return self.path(digest).read_bytes()
        except FileNotFoundError:
            raise BadImage(
                f"blob {digest} is missing from the store (pull or import again)"
            ) from None

    def size(self, digest: str) -> int:
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            return 0

    def put_bytes(self, data: bytes, expected: str | None = None) -> str:
        """Store ``data``; its digest, which must be ``expected`` when given."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if expected is not None and digest != expected:
            raise BadImage(f"content of {expected} has digest {digest}")
        if not self.has(digest):
            fd, tmp = tempfile.mkstemp(dir=self.tmp, prefix="blob-")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                os.replace(tmp, self.path(digest))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        return digest

    def put_stream(
        self,
        src: Readable,
        expected: str | None = None,
        size: int | None = None,
        progress: ProgressCallback | None = None,
        what: str = "blob",
    ) -> tuple[str, int]:
        """Copy ``src`` to a blob: (digest, size). ``expected``/``size`` are checked."""
        hasher = hashlib.sha256()
        done = 0
        fd, tmp = tempfile.mkstemp(dir=self.tmp, prefix="blob-")
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := src.read(CHUNK):
                    hasher.update(chunk)
                    out.write(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress(what, done, size)
            digest = "sha256:" + hasher.hexdigest()
            if size is not None and done != size:
                raise BadImage(f"{what}: {done} bytes where {size} were declared")
            if expected is not None and digest != expected:
                raise BadImage(f"{what}: content has digest {digest}, not {expected}")
            os.replace(tmp, self.path(digest))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return digest, done

    def commit(self, tmp: Path, digest: str) -> None:
        """Name a verified file of ``tmp`` as blob ``digest``."""
        os.replace(tmp, self.path(digest))

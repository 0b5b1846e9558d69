"""The one error type every route raises; app.py renders it as {"detail", "code"}."""

from __future__ import annotations

import errno


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


def invalid(detail: str) -> ApiError:
    return ApiError(422, "invalid_body", detail)


# What a file operation's errno means to the caller: (status, code, what is wrong).
# Anything else is 400 ``io_error`` with the system's own words.
_BY_ERRNO: dict[int, tuple[int, str, str]] = {
    errno.ENOENT: (404, "path_not_found", "no such path"),
    errno.ENOTDIR: (400, "not_a_directory", "a component on the way is not a directory"),
    errno.EISDIR: (400, "is_a_directory", "is a directory"),
    errno.EACCES: (400, "permission_denied", "permission denied"),
    errno.EPERM: (400, "permission_denied", "operation not permitted"),
    errno.EROFS: (400, "read_only", "is on a read-only file system"),
    errno.ENAMETOOLONG: (
        400,
        "invalid_path",
        "the path is too long (a name over 255 bytes or a path over 4095)",
    ),
    errno.ELOOP: (400, "path_escape", "too many levels of links, or a /proc magic link"),
    errno.ENOSPC: (400, "no_space", "no space left on the sandbox's file system"),
    errno.EDQUOT: (400, "no_space", "the sandbox's disk quota is used up"),
    errno.EFBIG: (413, "too_large", "the file is larger than the file system allows"),
}


def from_os_error(exc: OSError, where: str) -> ApiError:
    """The answer for a failed file operation on sandbox path ``where``."""
    known = _BY_ERRNO.get(exc.errno or 0)
    if known is None:
        return ApiError(400, "io_error", f"{where!r}: {exc.strerror or exc}")
    status, code, what = known
    if code == "path_not_found":
        return ApiError(status, code, f"{what}: {where!r}")
    return ApiError(status, code, f"{where!r}: {what}")

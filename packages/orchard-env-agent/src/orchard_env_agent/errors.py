"""The one error type every route raises; app.py renders it as {"detail", "code"}."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


def invalid(detail: str) -> ApiError:
    return ApiError(422, "invalid_body", detail)

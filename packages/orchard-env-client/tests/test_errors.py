"""Error answers become one exception class each, with status, code, detail and request id."""

from __future__ import annotations

import httpx
import pytest

from orchard_env_client import errors
from orchard_env_client.errors import error_from_response

pytestmark = pytest.mark.fast


def answer(status: int, code: str | None = None, detail: object = "boom", **headers: str):
    payload: dict[str, object] = {"detail": detail}
    if code is not None:
        payload["code"] = code
    return httpx.Response(status, json=payload, headers=headers)


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (400, "bad_request", errors.BadRequest),
        (401, "unauthorized", errors.AuthError),
        (404, "sandbox_not_found", errors.SandboxNotFound),
        (404, "job_not_found", errors.JobNotFound),
        (404, "path_not_found", errors.PathNotFound),
        (404, None, errors.NotFound),
        (408, "wait_timeout", errors.SandboxTimeout),
        (409, "conflict", errors.Conflict),
        (409, "sandbox_not_ready", errors.SandboxNotReady),
        (413, "too_large", errors.PayloadTooLarge),
        (422, "validation_error", errors.ValidationError),
        (429, "quota_exceeded", errors.QuotaExceeded),
        (503, "overloaded", errors.Overloaded),
        (500, "internal", errors.ServerError),
        (502, "bad_gateway", errors.ServerError),
        (418, None, errors.OrchardError),
    ],
)
def test_each_status_and_code_maps_to_its_exception(status, code, cls):
    err = error_from_response(answer(status, code))
    assert type(err) is cls and isinstance(err, errors.OrchardError)
    assert (err.status, err.code, err.message, err.detail) == (status, code, "boom", "boom")


def test_a_code_that_contradicts_the_status_falls_back_to_the_status():
    assert type(error_from_response(answer(409, "sandbox_not_found"))) is errors.Conflict


def test_the_servers_request_id_wins_over_the_one_sent():
    err = error_from_response(answer(400, "x", **{"X-Request-ID": "srv"}), request_id="mine")
    assert err.request_id == "srv"
    assert error_from_response(answer(400, "x"), request_id="mine").request_id == "mine"
    assert "request_id=srv" in str(error_from_response(answer(400, **{"X-Request-ID": "srv"})))


def test_retry_after_is_parsed_on_overloaded():
    err = error_from_response(answer(503, "overloaded", **{"Retry-After": "2.5"}))
    assert isinstance(err, errors.Overloaded) and err.retry_after == 2.5
    assert error_from_response(answer(503, **{"Retry-After": "soon"})).retry_after is None


def test_structured_detail_is_kept_and_non_json_bodies_still_map():
    detail = [{"loc": ["body", "x"], "msg": "extra"}]
    err = error_from_response(answer(422, "validation_error", detail=detail))
    assert err.detail == detail and "extra" in err.message
    plain = error_from_response(httpx.Response(502, text="upstream down"))
    assert type(plain) is errors.ServerError and plain.message == "upstream down"

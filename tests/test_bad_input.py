"""Bad input gets a clear JSON error with the right status, and changes nothing."""

from __future__ import annotations

import time

import httpx
import pytest

from orchard_testing import RunningServer, create_ready

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sid(server, image):
    body = create_ready(server.url, {"image": image})
    yield body["sandbox_id"]
    httpx.delete(f"{server.url}/sandboxes/{body['sandbox_id']}")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"image": ""},
        {"image": "host", "unknown_field": 1},
        {"image": "host", "sandbox_id": "Bad_ID!"},
        {"image": "host", "sandbox_id": "x" * 41},
        {"image": "host", "timeout": -1},
        {"image": "host", "memory": "lots"},
        {"image": "host", "env": {"K": 1}},
        {"image": "host", "env": {"A=B": "x"}},  # exec(2) could take no such name
        {"image": "host", "env": {"": "x"}},
        {"image": 5},
        {"image": "host", "block_network": 0},  # no coercion: 0 is not a boolean
        {"image": "host", "timeout": "60"},
    ],
)
def test_invalid_create_bodies_are_422(server, body):
    before = httpx.get(f"{server.url}/sandboxes").json()["sandboxes"]
    response = httpx.post(f"{server.url}/sandboxes", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "invalid_body" and response.json()["detail"]
    assert httpx.get(f"{server.url}/sandboxes").json()["sandboxes"] == before


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"command": ""},
        {"command": []},
        {"command": "true", "bogus": 1},
        {"command": "true", "timeout_seconds": 0},
        {"command": 12},
        {"command": "true", "wait": 1},
        {"command": "true", "env": {"A=B": "x"}},
        {"command": "true", "env": {"": "x"}},
    ],
)
def test_invalid_exec_bodies_are_422(server, sid, body):
    response = httpx.post(f"{server.url}/sandboxes/{sid}/exec", json=body)
    assert response.status_code == 422 and response.json()["code"] == "invalid_body"


def test_malformed_json_is_422(server):
    response = httpx.post(
        f"{server.url}/sandboxes",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422 and response.json()["code"] == "invalid_body"


def test_unknown_sandboxes_and_jobs_are_404_with_codes(server):
    assert httpx.get(f"{server.url}/sandboxes/nope").json()["code"] == "sandbox_not_found"
    assert httpx.get(f"{server.url}/jobs/nope.123").json()["code"] == "job_not_found"
    assert httpx.get(f"{server.url}/jobs/garbage").status_code == 404


def test_a_request_id_is_echoed_or_minted(server):
    assert (
        httpx.get(f"{server.url}/health", headers={"X-Request-ID": "abc-123"}).headers[
            "x-request-id"
        ]
        == "abc-123"
    )
    assert httpx.get(f"{server.url}/health").headers["x-request-id"]


def test_long_command_lines_and_nul_bytes_are_handled(server, sid):
    long = "echo " + "x" * 10_000
    job = httpx.post(
        f"{server.url}/sandboxes/{sid}/exec", json={"command": long, "wait": True}
    ).json()
    assert job["exit_code"] == 0 and len(job["stdout"]) == 10_001
    for body in (
        {"command": "echo a\u0000b"},
        {"command": ["echo", "a\u0000"]},
        {"command": "true", "env": {"K": "v\u0000"}},
    ):
        response = httpx.post(f"{server.url}/sandboxes/{sid}/exec", json={**body, "wait": True})
        assert response.status_code == 422, response.text
        assert "NUL" in response.json()["detail"]


def test_an_oversized_upload_is_413_and_writes_nothing(backend, image, tmp_path):
    srv = RunningServer(backend=backend, state_dir=tmp_path / "s")
    srv.start("--max-upload-bytes", "1000")
    try:
        sid = create_ready(srv.url, {"image": image})["sandbox_id"]
        url = f"{srv.url}/sandboxes/{sid}/fs"
        response = httpx.put(url, params={"path": "/workspace/big"}, content=b"x" * 5000)
        assert response.status_code == 413 and response.json()["code"]

        def chunks():
            for _ in range(5):
                yield b"y" * 1000

        response = httpx.put(url, params={"path": "/workspace/big2"}, content=chunks())
        assert response.status_code == 413
        # The refused target never appears; the agent drops its temp file as the aborted
        # stream reaches it, a moment after the orchestrator answered 413.
        deadline = time.monotonic() + 5
        while True:
            listing = httpx.get(
                f"{srv.url}/sandboxes/{sid}/files/list", params={"path": "/workspace"}
            )
            names = [f["name"] for f in listing.json()["files"]]
            assert "big" not in names and "big2" not in names
            if not names or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert names == []
    finally:
        srv.stop()


def test_exec_on_a_deleted_sandbox_is_404(server, image):
    sid = httpx.post(f"{server.url}/sandboxes", json={"image": image}).json()["sandbox_id"]
    httpx.delete(f"{server.url}/sandboxes/{sid}")
    response = httpx.post(f"{server.url}/sandboxes/{sid}/exec", json={"command": "true"})
    assert response.status_code == 404


def test_a_405_allows_every_method_of_the_path(server):
    # FastAPI has one route per method; the Allow header must list all of the path's.
    response = httpx.request("PATCH", f"{server.url}/sandboxes")
    assert response.status_code == 405 and response.json()["code"] == "method_not_allowed"
    assert response.headers["allow"] == "GET, POST"
    assert httpx.options(f"{server.url}/sandboxes/x").headers["allow"] == "DELETE, GET"


def test_invalid_base64_content_is_422_and_the_schema_says_base64(server, sid):
    response = httpx.post(
        f"{server.url}/sandboxes/{sid}/files",
        json={"path": "/workspace/b64", "content": "W\u00e9=="},
    )
    assert response.status_code == 422 and response.json()["code"] == "invalid_body"
    body = httpx.get(f"{server.url}/openapi.json").json()["components"]["schemas"]
    assert body["WriteFileRequest"]["properties"]["content"]["pattern"]


def test_the_openapi_documents_non_json_answers_and_raw_bodies(server):
    spec = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    assert "text/plain" in spec["/metrics"]["get"]["responses"]["200"]["content"]
    raw_get = spec["/sandboxes/{sandbox_id}/fs"]["get"]["responses"]["200"]["content"]
    assert set(raw_get) == {"application/octet-stream", "application/x-tar"}
    assert (
        "application/octet-stream"
        in spec["/sandboxes/{sandbox_id}/fs"]["put"]["requestBody"]["content"]
    )
    port = spec["/sandboxes/{sandbox_id}/ports/{port}/{path}"]["get"]["responses"]
    assert "502" in port and "default" in port
    (label,) = spec["/sandboxes"]["get"]["parameters"]
    assert label["schema"]["items"]["pattern"] == "^[^=]+="
    assert httpx.get(f"{server.url}/sandboxes", params={"label": "novalue"}).status_code == 400


PATH_ECHO = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = self.path.encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", 8125), H).serve_forever()
"""


def test_forwarded_paths_are_re_encoded_not_decoded_on_the_way(server, sid):
    job = httpx.post(
        f"{server.url}/sandboxes/{sid}/exec",
        json={"command": ["python3", "-c", PATH_ECHO], "timeout_seconds": 120},
    )
    base = f"{server.url}/sandboxes/{sid}/ports/8125"
    try:
        deadline = time.monotonic() + 20
        while httpx.get(f"{base}/").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # Non-ASCII was a 500 (the agent wrote it raw into the request line); a decoded
        # "?" started a query; ".." segments were resolved by the HTTP client, so this
        # one reached the agent's own /files endpoint instead of the sandboxed service.
        for sent, seen in [
            ("caf%C3%A9", "/caf%C3%A9"),
            ("a%3Fb%23c", "/a%3Fb%23c"),
            ("x/%2E%2E/%2E%2E/%2E%2E/files?path=fuzz", "/x/%2E%2E/%2E%2E/%2E%2E/files?path=fuzz"),
        ]:
            response = httpx.get(f"{base}/{sent}")
            assert (response.status_code, response.text) == (200, seen)
    finally:
        httpx.post(f"{server.url}/jobs/{job.json()['job_id']}/cancel")

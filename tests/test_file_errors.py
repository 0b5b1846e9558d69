"""Every error code of the file API, each produced through the orchestrator and the agent.

docs/api.md's "File errors" table lists the codes; this module makes each one happen on a
real sandbox. Where a backend cannot produce a code (a local sandbox cannot fill a small
tmpfs or bind-mount a file), the test runs on the backends that can.
"""

from __future__ import annotations

import http.client
import io
import tarfile
from collections.abc import Iterator
from typing import Any

import attrs
import httpx
import pytest

from orchard_testing import RunningServer, create_ready, only_backend, selected_backends

pytestmark = pytest.mark.integration

WHERE = "/workspace/e"
NAME_MAX = 255
LONG_NAME = "n" * (NAME_MAX + 1)
# 4,220 bytes in 2,121 characters: under the orchestrator's 4096-character bound, over
# Linux's PATH_MAX, every name within NAME_MAX.
DEEP_PATH = "/workspace/" + "/".join(["é" * 100] * 21)


def containers_only() -> pytest.MarkDecorator:
    """Run a test on the container backends only (what it needs, a local sandbox lacks)."""
    chosen = selected_backends()
    skip = pytest.mark.skip(reason="not in ORCHARD_TEST_BACKENDS")
    params = [b if b in chosen else pytest.param(b, marks=skip) for b in ("docker", "kubernetes")]
    return pytest.mark.parametrize("backend", params, indirect=True)


@attrs.define
class Api:
    """One sandbox's file routes, answering (status, code)."""

    url: str
    sandbox_id: str
    backend: str

    def call(self, method: str, route: str, **kw: Any) -> tuple[int, str | None]:
        response = httpx.request(
            method, f"{self.url}/sandboxes/{self.sandbox_id}{route}", timeout=120, **kw
        )
        if response.status_code == 200:
            return 200, None
        return response.status_code, response.json().get("code")

    def run(self, command: str) -> str:
        job = httpx.post(
            f"{self.url}/sandboxes/{self.sandbox_id}/exec",
            json={"command": command, "wait": True},
            timeout=120,
        ).json()
        assert job.get("exit_code") == 0, job
        return str(job["stdout"])


@pytest.fixture(scope="module")
def api(server: RunningServer, image: str) -> Iterator[Api]:
    created = create_ready(server.url, {"image": image})
    assert created.get("status") == "ready", created
    sandbox = Api(server.url, str(created["sandbox_id"]), server.backend)
    sandbox.run(
        f"mkdir -p {WHERE}/dir && cd {WHERE} && printf x > file && mkfifo fifo"
        " && ln -s loop1 loop2 && ln -s loop2 loop1"
        " && printf secret > locked && chmod 000 locked"
    )
    yield sandbox
    httpx.delete(f"{server.url}/sandboxes/{sandbox.sandbox_id}", timeout=60)


def _tar(name: str, data: bytes = b"x") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tf:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _get(path: str, **params: str) -> dict[str, Any]:
    return {"params": {"path": path, **params}}


def _put(path: str, content: bytes = b"x", **params: str) -> dict[str, Any]:
    return {"params": {"path": path, **params}, "content": content}


def _post(path: str) -> dict[str, Any]:
    return {"json": {"path": path, "content": "eA=="}}


# (code, status, method, route, request) for what every backend can produce.
CASES = [
    # A path no system call could take: a bad request, not an escape.
    ("invalid_path", 400, "GET", "/files", _get(f"{WHERE}/{LONG_NAME}")),
    ("invalid_path", 400, "GET", "/files/list", _get(f"{WHERE}/{LONG_NAME}/sub")),
    ("invalid_path", 400, "GET", "/fs", _get(f"{WHERE}/{LONG_NAME}")),
    ("invalid_path", 400, "PUT", "/fs", _put(f"{WHERE}/missing/{LONG_NAME}")),
    ("invalid_path", 400, "PUT", "/fs", _put(f"e/{LONG_NAME}")),  # relative to /workspace
    ("invalid_path", 400, "POST", "/files", _post(f"{WHERE}/{LONG_NAME}")),
    ("invalid_path", 400, "GET", "/files", _get(DEEP_PATH)),
    ("invalid_path", 400, "POST", "/files", _post(DEEP_PATH)),
    ("invalid_path", 400, "GET", "/files", _get(f"{WHERE}/a\0b")),
    # Out of the sandbox's view, by `..`, a link loop or an archive member.
    ("path_escape", 400, "GET", "/files", _get("/..")),
    ("path_escape", 400, "PUT", "/fs", _put("/../x")),
    ("path_escape", 400, "GET", "/files", _get(f"{WHERE}/loop1")),
    ("path_escape", 400, "PUT", "/fs", _put(f"{WHERE}/dir", _tar("../evil"), archive="tar")),
    ("path_not_found", 404, "GET", "/files", _get(f"{WHERE}/nope")),
    ("path_not_found", 404, "GET", "/files/list", _get(f"{WHERE}/nope")),
    ("path_not_found", 404, "GET", "/fs", _get(f"{WHERE}/nope/deeper")),
    ("not_a_directory", 400, "GET", "/files/list", _get(f"{WHERE}/file")),
    ("not_a_directory", 400, "GET", "/files", _get(f"{WHERE}/file/x")),
    ("not_a_directory", 400, "PUT", "/fs", _put(f"{WHERE}/file/x")),
    ("not_a_directory", 400, "PUT", "/fs", _put(f"{WHERE}/file", _tar("a"), archive="tar")),
    ("not_a_directory", 400, "GET", "/fs", _get(f"{WHERE}/file", archive="tar")),
    ("is_a_directory", 400, "GET", "/files", _get(f"{WHERE}/dir")),
    ("is_a_directory", 400, "GET", "/fs", _get(f"{WHERE}/dir")),
    ("is_a_directory", 400, "PUT", "/fs", _put(f"{WHERE}/dir")),
    ("is_a_directory", 400, "POST", "/files", _post(f"{WHERE}/dir/")),
    # A FIFO is never opened: reading one would block, and wake a waiting writer.
    ("not_a_file", 400, "GET", "/files", _get(f"{WHERE}/fifo")),
    ("not_a_file", 400, "GET", "/fs", _get(f"{WHERE}/fifo")),
    ("invalid_archive", 400, "PUT", "/fs", _put(f"{WHERE}/dir", b"no tar" * 200, archive="tar")),
    # Refused by the orchestrator before any agent sees them.
    ("invalid_body", 422, "GET", "/files", {}),
    ("invalid_path", 400, "GET", "/files", _get("/" + "x" * 4096)),
    ("invalid_body", 422, "PUT", "/fs", _put(f"{WHERE}/dir", _tar("a"), archive="zip")),
    ("invalid_body", 422, "POST", "/files", {"json": {"path": f"{WHERE}/b", "content": "!"}}),
]


@pytest.mark.parametrize(
    ("code", "status", "method", "route", "request_kw"),
    CASES,
    ids=[f"{c[0]}-{c[2]}{c[3]}-{i}" for i, c in enumerate(CASES)],
)
def test_each_file_error_code(
    api: Api, code: str, status: int, method: str, route: str, request_kw: dict[str, Any]
) -> None:
    assert api.call(method, route, **request_kw) == (status, code)


def test_a_name_of_exactly_255_bytes_is_fine(api: Api) -> None:
    name = "m" * NAME_MAX
    assert api.call("PUT", "/fs", **_put(f"{WHERE}/{name}", b"edge")) == (200, None)
    assert api.run(f"cat {WHERE}/{name}") == "edge"


def test_the_too_long_path_says_what_the_limit_is(api: Api) -> None:
    url = f"{api.url}/sandboxes/{api.sandbox_id}/files"
    response = httpx.get(url, params={"path": f"{WHERE}/{LONG_NAME}"})
    assert "256 bytes long; the limit is 255" in response.json()["detail"]
    response = httpx.get(url, params={"path": DEEP_PATH})
    assert "the limit is 4095" in response.json()["detail"]


def test_read_only(api: Api) -> None:
    # A local sandbox's /etc is a read-only mount; a container's /sys a read-only file system.
    path = "/etc/orchard-x" if api.backend == "local" else "/sys/orchard-x"
    assert api.call("PUT", "/fs", **_put(path)) == (400, "read_only")
    assert api.call("POST", "/files", **_post(path)) == (400, "read_only")


def test_permission_denied(api: Api) -> None:
    # The local file API acts as the sandbox's unprivileged owner, whom mode 000 stops; in a
    # container it is root with the sandbox's capabilities, which lack CAP_SYSLOG.
    path = f"{WHERE}/locked" if api.backend == "local" else "/proc/kmsg"
    assert api.call("GET", "/files", **_get(path)) == (400, "permission_denied")
    assert api.call("GET", "/fs", **_get(path)) == (400, "permission_denied")


@only_backend("local")  # root in a container reads any directory
def test_an_unreadable_directory_is_refused_before_its_tar_starts(api: Api) -> None:
    api.run(f"mkdir -p {WHERE}/closed && chmod 000 {WHERE}/closed")
    params = {"path": f"{WHERE}/closed", "archive": "tar"}
    assert api.call("GET", "/fs", params=params) == (400, "permission_denied")


def test_an_upload_over_the_cap_is_too_large(api: Api, server: RunningServer) -> None:
    # Only the header says how big: the orchestrator refuses before reading any body.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.putrequest("PUT", f"/sandboxes/{api.sandbox_id}/fs?path={WHERE}/huge")
        conn.putheader("Content-Length", str(1 << 40))
        conn.endheaders()
        answer = conn.getresponse()
        assert answer.status == 413 and b'"too_large"' in answer.read()
    finally:
        conn.close()


def test_an_unknown_sandbox_is_sandbox_not_found(server: RunningServer) -> None:
    response = httpx.get(f"{server.url}/sandboxes/sbx-000000000000/files", params={"path": "/x"})
    assert (response.status_code, response.json()["code"]) == (404, "sandbox_not_found")


@containers_only()
def test_io_error(api: Api) -> None:
    # /etc/hosts is a file bind-mounted over the image's: replacing it is EBUSY; reading
    # /proc/1/clear_refs, a write-only file root may open, is EINVAL.
    assert api.call("PUT", "/fs", **_put("/etc/hosts", b"127.0.0.1 x\n")) == (400, "io_error")
    assert api.call("GET", "/files", **_get("/proc/1/clear_refs")) == (400, "io_error")


@containers_only()
def test_no_space(api: Api) -> None:
    # A container's /dev/shm is a 64 MiB tmpfs; the refused upload leaves no temp file.
    size = int(api.run("df -k --output=size /dev/shm | tail -1")) * 1024
    assert size <= 256 << 20, f"/dev/shm holds {size} bytes: this test needs a small tmpfs"
    too_much = b"\0" * (size + (1 << 20))
    assert api.call("PUT", "/fs", **_put("/dev/shm/fill", too_much)) == (400, "no_space")
    assert api.run("ls -A /dev/shm") == ""


@containers_only()
def test_devices_are_not_read_as_files(api: Api) -> None:
    # /dev/zero would never end: refused before it is opened.
    assert api.call("GET", "/files", **_get("/dev/zero")) == (400, "not_a_file")
    assert api.call("GET", "/fs", **_get("/dev/zero")) == (400, "not_a_file")

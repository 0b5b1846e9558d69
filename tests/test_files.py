"""Files: base64 and raw round trips, listing, large data, tar, and paths that escape."""

from __future__ import annotations

import base64
import io
import os
import tarfile

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchard_env_client import SandboxClient
from orchard_env_client.errors import OrchardError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(server):
    with SandboxClient(base_url=server.url) as c:
        yield c


@pytest.fixture(scope="module")
def sandbox(client, image):
    sbx = client.create_sandbox(image)
    yield sbx
    sbx.delete()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=4096))
def test_arbitrary_bytes_round_trip_raw(sandbox, data):
    sandbox.upload_content("/workspace/blob.bin", data)
    assert sandbox.download_content("/workspace/blob.bin") == data


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=2048))
def test_arbitrary_bytes_round_trip_base64(server, sandbox, data):
    base = f"{server.url}/sandboxes/{sandbox.sandbox_id}/files"
    body = {"path": "/workspace/b64.bin", "content": base64.b64encode(data).decode()}
    assert httpx.post(base, json=body).json() == {
        "success": True,
        "path": "/workspace/b64.bin",
        "size": len(data),
    }
    got = httpx.get(base, params={"path": "/workspace/b64.bin"}).json()
    assert base64.b64decode(got["content"]) == data and got["size"] == len(data)


def test_files_written_are_visible_to_commands_and_back(sandbox):
    sandbox.upload_content("/workspace/deep/dir/hello.txt", "hi there")
    assert sandbox.exec("cat /workspace/deep/dir/hello.txt").stdout == "hi there"
    sandbox.exec("echo made-inside > /workspace/inside.txt")
    assert sandbox.download_content("/workspace/inside.txt") == b"made-inside\n"


def test_relative_paths_resolve_against_the_workdir(sandbox):
    sandbox.upload_content("rel.txt", "relative")
    assert sandbox.exec("cat /workspace/rel.txt").stdout == "relative"


def test_list_shows_names_types_and_sizes(sandbox):
    sandbox.exec(
        "mkdir -p /workspace/ls/d && printf abc > /workspace/ls/f && ln -sf f /workspace/ls/l"
    )
    entries = {f.name: f for f in sandbox.list_files("/workspace/ls")}
    assert entries["f"].type == "file" and entries["f"].size == 3
    assert entries["d"].type == "directory"
    assert entries["l"].type == "symlink"


def test_large_files_stream_both_ways(sandbox, tmp_path):
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(32 << 20))
    sandbox.upload_file(str(src), "/workspace/big.bin")
    assert sandbox.exec("stat -c %s /workspace/big.bin").stdout.strip() == str(32 << 20)
    dst = tmp_path / "back.bin"
    sandbox.download_file("/workspace/big.bin", str(dst))
    assert dst.read_bytes() == src.read_bytes()


def test_a_directory_moves_as_a_tar(server, sandbox):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in {"a.txt": b"A", "sub/b.txt": b"B"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    url = f"{server.url}/sandboxes/{sandbox.sandbox_id}/fs"
    put = httpx.put(
        url, params={"path": "/workspace/tree", "archive": "tar"}, content=buf.getvalue()
    )
    assert put.status_code == 200, put.text
    assert sandbox.exec("cat /workspace/tree/sub/b.txt").stdout == "B"
    got = httpx.get(url, params={"path": "/workspace/tree", "archive": "tar"})
    with tarfile.open(fileobj=io.BytesIO(got.content)) as tar:
        names = tar.getnames()
    assert any(n.endswith("sub/b.txt") for n in names)


def test_a_missing_file_is_404(sandbox):
    with pytest.raises(OrchardError) as err:
        sandbox.download_content("/workspace/nope.txt")
    assert err.value.status == 404


@pytest.mark.parametrize(
    "path", ["/workspace/../../../etc/shadow-copy", "../../outside.txt", "/workspace/link-out/x"]
)
def test_writes_never_escape_the_sandbox(server, sandbox, path):
    sandbox.exec("ln -sfn / /workspace/link-out")
    url = f"{server.url}/sandboxes/{sandbox.sandbox_id}/fs"
    response = httpx.put(url, params={"path": path}, content=b"escape")
    if server.backend == "local":  # its root is the host's own, read-only
        assert response.status_code in (400, 404, 409), response.text
        assert response.json()["code"]
    # (a container's root is its own and writable: there the write lands inside it)
    assert not os.path.exists("/etc/shadow-copy") and not os.path.exists("/x")


def test_the_orchestrator_state_is_invisible_through_files_and_commands(server, sandbox):
    state_dir = server.state_dir.resolve()
    sandbox.exec(f"ln -sfn {state_dir} /workspace/state-link")
    url = f"{server.url}/sandboxes/{sandbox.sandbox_id}/files/list"
    hidden = ["/workspace/state-link", str(state_dir)]
    if server.backend == "local":  # a container's /proc is its own; the host's is hidden
        hidden.append("/proc/1")
    for path in hidden:
        response = httpx.get(url, params={"path": path})
        assert response.status_code in (400, 404) or response.json()["files"] == [], path
    assert "sandboxes" not in sandbox.exec(f"ls {state_dir} 2>&1").stdout

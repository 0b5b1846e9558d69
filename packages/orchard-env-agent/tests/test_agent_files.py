"""File routes against a real agent process."""

from __future__ import annotations

import base64
import io
import os
import tarfile

import pytest
from agent_harness import Agent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(max_size=5000), name=st.from_regex(r"[a-z0-9_]{1,12}", fullmatch=True))
def test_files_roundtrip(single: Agent, data: bytes, name: str) -> None:
    h = single.headers()
    path = f"hyp/{name}.bin"
    r = single.client.post(
        "/files", json={"path": path, "content": base64.b64encode(data).decode()}, headers=h
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"success": True, "path": f"{single.workdir}/{path}", "size": len(data)}
    r = single.client.get("/files", params={"path": path}, headers=h)
    assert base64.b64decode(r.json()["content"]) == data and r.json()["size"] == len(data)


def test_list_and_errors(single: Agent) -> None:
    h = single.headers()
    d = single.workdir / "listing"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("abc")
    os.symlink("a.txt", d / "ln")
    r = single.client.get("/files/list", params={"path": "listing"}, headers=h).json()
    kinds = {f["name"]: (f["type"], f["size"]) for f in r["files"]}
    assert (
        kinds["a.txt"] == ("file", 3)
        and kinds["sub"][0] == "directory"
        and kinds["ln"][0] == "symlink"
    )
    assert all(isinstance(f["modified"], float) for f in r["files"])
    r = single.client.get("/files", params={"path": "listing/missing"}, headers=h)
    assert r.status_code == 404 and r.json()["code"] == "path_not_found"
    r = single.client.post("/files", json={"path": "x", "content": "!!!"}, headers=h)
    assert r.status_code == 422
    r = single.client.get("/files", params={"path": "/.."}, headers=h)
    assert r.status_code == 400 and r.json()["code"] == "path_escape"


def test_raw_20mb(single: Agent) -> None:
    h = single.headers()
    data = os.urandom(20 << 20)
    r = single.client.put("/fs", params={"path": "big/raw.bin"}, content=data, headers=h)
    assert r.status_code == 200 and r.json()["size"] == len(data)
    r = single.client.get("/fs", params={"path": "big/raw.bin"}, headers=h)
    assert r.status_code == 200 and r.content == data


def test_upload_cap(single: Agent) -> None:  # the fixture's cap is 30 MiB
    h = single.headers()

    def gen():  # no content-length: the cap is enforced while streaming
        for _ in range(31):
            yield b"\0" * (1 << 20)

    r = single.client.put("/fs", params={"path": "capped/x.bin"}, content=gen(), headers=h)
    assert r.status_code == 413 and r.json()["code"]
    assert not (single.workdir / "capped" / "x.bin").exists()
    assert [p for p in (single.workdir / "capped").iterdir()] == []


def test_tar_roundtrip(single: Agent) -> None:
    h = single.headers()
    src = single.workdir / "tsrc"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f.bin").write_bytes(b"\x00\x01" * 1000)
    (src / "top.txt").write_text("top")
    r = single.client.get("/fs", params={"path": "tsrc", "archive": "tar"}, headers=h)
    assert r.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tf:
        names = tf.getnames()
    assert "d/f.bin" in names and "top.txt" in names
    r = single.client.put(
        "/fs", params={"path": "tdst", "archive": "tar"}, content=r.content, headers=h
    )
    assert r.status_code == 200, r.text
    assert (single.workdir / "tdst" / "d" / "f.bin").read_bytes() == b"\x00\x01" * 1000


def test_tar_refuses_escape(single: Agent) -> None:
    h = single.headers()
    for member in ["../evil.txt", "/abs.txt"]:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            info = tarfile.TarInfo(member)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
        r = single.client.put(
            "/fs", params={"path": "tesc", "archive": "tar"}, content=buf.getvalue(), headers=h
        )
        assert r.status_code == 400, member
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("ln")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tf.addfile(info)
    r = single.client.put(
        "/fs", params={"path": "tesc", "archive": "tar"}, content=buf.getvalue(), headers=h
    )
    assert r.status_code == 400
    assert not (single.workdir.parent / "evil.txt").exists()


def test_multi_mounts_and_escapes(multi: Agent) -> None:
    h = multi.headers()
    content = base64.b64encode(b"hello").decode()
    r = multi.client.post(
        "/files", json={"path": "/workspace/a/b.txt", "content": content}, headers=h
    )
    assert r.status_code == 200 and (multi.workdir / "a" / "b.txt").read_bytes() == b"hello"
    os.symlink("/etc", multi.workdir / "etc_link")  # /etc is not mounted in this sandbox
    os.symlink("../../", multi.workdir / "up_link")
    os.symlink("/workspace/a", multi.workdir / "in_link")
    for path in ["/workspace/../agent.log", "/workspace/up_link/x", "/workspace/etc_link/passwd"]:
        r = multi.client.get("/files", params={"path": path}, headers=h)
        assert r.status_code == 400 and r.json()["code"] == "path_escape", (path, r.text)
        r = multi.client.post("/files", json={"path": path, "content": content}, headers=h)
        assert r.status_code == 400, path
    r = multi.client.get("/files", params={"path": "/workspace/in_link/b.txt"}, headers=h)
    assert base64.b64decode(r.json()["content"]) == b"hello"
    r = multi.client.get("/files", params={"path": "/etc/passwd"}, headers=h)
    assert r.status_code == 404
    r = multi.client.post("/files", json={"path": "/ro/x.txt", "content": content}, headers=h)
    assert r.status_code == 400 and r.json()["code"] == "read_only"
    r = multi.client.put("/fs", params={"path": "/ro/y"}, content=b"x", headers=h)
    assert r.status_code == 400 and r.json()["code"] == "read_only"
    r = multi.client.get("/files", params={"path": "/ro/agent.log"}, headers=h)
    assert r.status_code == 200

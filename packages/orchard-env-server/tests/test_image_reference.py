"""Image references as Docker normalizes them, and the platform choice of manifest lists."""

from __future__ import annotations

import json

import pytest

from orchard_env_server.images import (
    BadImage,
    ImageNotFound,
    InvalidReference,
    normalize_reference,
    parse_reference,
)
from orchard_env_server.images.model import Manifest, ParsedConfig, choose_manifest

pytestmark = pytest.mark.fast
DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("ref", "normalized"),
    [
        ("python:3.11-slim", "docker.io/library/python:3.11-slim"),
        ("python", "docker.io/library/python:latest"),
        ("library/python", "docker.io/library/python:latest"),
        ("index.docker.io/team/tool:1", "docker.io/team/tool:1"),
        ("orchard-test/busybox", "docker.io/orchard-test/busybox:latest"),
        ("127.0.0.1:5000/x/y", "127.0.0.1:5000/x/y:latest"),
        ("localhost/x", "localhost/x:latest"),
        ("localhost:5000", "docker.io/library/localhost:5000"),
        ("ghcr.io/org/a.b_c-d/e__f:v1.2-rc", "ghcr.io/org/a.b_c-d/e__f:v1.2-rc"),
        (f"python@{DIGEST}", f"docker.io/library/python@{DIGEST}"),
        (f"127.0.0.1:5000/x:t@{DIGEST}", f"127.0.0.1:5000/x:t@{DIGEST}"),
        ("[::1]:5000/x", "[::1]:5000/x:latest"),
    ],
)
def test_references_normalize_as_docker_does(ref, normalized):
    assert normalize_reference(ref) == normalized


def test_the_parts_of_a_reference():
    ref = parse_reference(f"127.0.0.1:5000/team/tool:1@{DIGEST}")
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (
        "127.0.0.1:5000",
        "team/tool",
        "1",
        DIGEST,
    )
    assert ref.name == "127.0.0.1:5000/team/tool"


@pytest.mark.parametrize(
    "ref",
    ["", "Python", "a::b", "/abs/path", "x@sha256:short", "a/-b", "a:" + "t" * 200, "a b", "a//b"],
)
def test_invalid_references_are_value_errors(ref):
    with pytest.raises(InvalidReference) as info:
        parse_reference(ref)
    assert isinstance(info.value, ValueError)
    assert info.value.code == "invalid_reference"


def _entry(digest_char: str, platform: dict | None, media_type: str = "x") -> dict:
    entry = {"mediaType": media_type, "digest": "sha256:" + digest_char * 64, "size": 10}
    if platform is not None:
        entry["platform"] = platform
    return entry


def test_a_manifest_list_resolves_to_this_machines_linux_entry(monkeypatch):
    index = {
        "manifests": [
            _entry("a", {"os": "unknown", "architecture": "unknown"}),
            _entry("b", {"os": "linux", "architecture": "arm", "variant": "v7"}),
            _entry("c", {"os": "linux", "architecture": "arm64", "variant": "v8"}),
            _entry("d", {"os": "windows", "architecture": "amd64"}),
            _entry("e", {"os": "linux", "architecture": "amd64"}),
        ]
    }
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    assert choose_manifest(index, "list").digest == "sha256:" + "e" * 64
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    assert choose_manifest(index, "list").digest == "sha256:" + "c" * 64
    monkeypatch.setattr("platform.machine", lambda: "riscv64")
    with pytest.raises(ImageNotFound, match=r"linux/riscv64.*linux/amd64"):
        choose_manifest(index, "list")


@pytest.mark.parametrize(
    "doc",
    [
        {"schemaVersion": 1, "fsLayers": []},
        {"schemaVersion": 2, "config": {"digest": "md5:x", "size": 1}, "layers": []},
        {"schemaVersion": 2, "config": {"digest": DIGEST, "size": -1}, "layers": []},
        {"schemaVersion": 2, "config": {"digest": DIGEST, "size": 1}},
        {"schemaVersion": 2, "manifests": []},
    ],
    ids=["schema1", "md5", "negative-size", "no-layers", "an-index"],
)
def test_malformed_manifests_are_bad_images(doc):
    with pytest.raises(BadImage):
        Manifest.parse(json.dumps(doc).encode())
    with pytest.raises(BadImage):
        Manifest.parse(b"{not json")


def test_an_image_config_gives_env_workdir_user_entrypoint_cmd():
    doc = {
        "created": "2024-01-01T00:00:00Z",
        "config": {"Env": ["A=1"], "WorkingDir": "/w", "User": "1000:1000", "Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": [DIGEST]},
    }
    parsed = ParsedConfig.parse(json.dumps(doc).encode())
    assert parsed.config.env == ("A=1",) and parsed.config.working_dir == "/w"
    assert parsed.config.user == "1000:1000" and parsed.config.cmd == ("sh",)
    assert parsed.config.entrypoint is None and parsed.diff_ids == (DIGEST,)
    with pytest.raises(BadImage):
        ParsedConfig.parse(json.dumps({**doc, "config": {"Env": "A=1"}}).encode())

"""Unit tests of orchard_env_server.backends.kubernetes.api: CredentialFiles (the TLS files)."""

from __future__ import annotations

import asyncio
import base64
import fcntl
import json
import os
import stat
import tempfile
from pathlib import Path

import pytest
from kubernetes.config import kube_config

from orchard_env_server.backends.base import BackendError
from orchard_env_server.backends.kubernetes.api import CredentialFiles, load_configuration
from orchard_env_server.backends.kubernetes.backend import KubernetesBackend
from orchard_env_server.settings import Settings

pytestmark = pytest.mark.fast


# --- CredentialFiles: the kubeconfig's TLS material -------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_kubeconfig(path: Path) -> Path:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": "https://127.0.0.1:1",
                    "certificate-authority-data": b64(b"CA-PEM"),
                },
            }
        ],
        "users": [
            {
                "name": "u",
                "user": {
                    "client-certificate-data": b64(b"CERT-PEM"),
                    "client-key-data": b64(b"SECRET-KEY-PEM"),
                },
            }
        ],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


@pytest.fixture
def private_tmpdir(tmp_path, monkeypatch):
    """$TMPDIR of the test: where the client would put its files."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_tls_material_goes_to_a_private_directory_and_is_removed(tmp_path, private_tmpdir):
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig")
    files = CredentialFiles(tmp_path / "state" / "credentials")
    cfg = load_configuration(kubeconfig, files)
    assert files.path is not None
    assert mode(files.root) == 0o700 and mode(files.path) == 0o700
    paths = {Path(p) for p in (cfg.ssl_ca_cert, cfg.cert_file, cfg.key_file)}
    assert {p.parent for p in paths} == {files.path}
    assert sorted(p.read_bytes() for p in paths) == [b"CA-PEM", b"CERT-PEM", b"SECRET-KEY-PEM"]
    assert all(mode(p) == 0o600 for p in paths)
    assert list(private_tmpdir.iterdir()) == []
    registry = kube_config._temp_files.values()
    assert not any(Path(p).parent == files.path for p in registry)
    # Another load of the same kubeconfig gets files of its own, not a cached path.
    other = CredentialFiles(tmp_path / "state" / "credentials")
    cfg2 = load_configuration(kubeconfig, other)
    assert Path(cfg2.key_file).parent == other.path != files.path
    files.remove()
    assert not any(p.exists() for p in paths)
    assert Path(cfg2.key_file).read_bytes() == b"SECRET-KEY-PEM"  # the other's is intact
    other.remove()
    assert list(files.root.iterdir()) == []
    assert list(private_tmpdir.iterdir()) == []


def test_without_a_private_directory_the_client_leaves_its_files_in_tmpdir(
    tmp_path, private_tmpdir
):
    """The bug CredentialFiles fixes: the key lands in $TMPDIR, removed only at exit."""
    cfg = load_configuration(write_kubeconfig(tmp_path / "kubeconfig"))
    try:
        assert Path(cfg.key_file).parent == private_tmpdir
    finally:
        for path in private_tmpdir.iterdir():
            path.unlink()
        registry = kube_config._temp_files
        for key, name in list(registry.items()):
            if Path(name).parent == private_tmpdir:
                del registry[key]


def test_an_unusable_kubeconfig_leaves_no_directory(tmp_path, private_tmpdir):
    bad = tmp_path / "kubeconfig"
    bad.write_text("{}")
    files = CredentialFiles(tmp_path / "credentials")
    with pytest.raises(BackendError, match="no usable Kubernetes configuration"):
        load_configuration(bad, files)
    assert files.path is None and list(files.root.iterdir()) == []


def test_directories_of_dead_processes_are_swept_and_living_ones_kept(tmp_path):
    root = tmp_path / "credentials"
    alive = CredentialFiles(root)
    alive.create()
    dead = root / "p-dead"  # its process died: the lock file is there, unlocked
    dead.mkdir()
    (dead / ".lock").touch()
    (dead / "tmpkey").write_text("SECRET-KEY-PEM")
    young = root / "p-young"  # being made right now: no lock file yet
    young.mkdir()
    old = root / "p-old"
    old.mkdir()
    os.utime(old, (0, 0))
    mine = CredentialFiles(root)
    path = mine.create()
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [alive.path.name, path.name, "p-young"]  # type: ignore[union-attr]
    )
    # A directory in use stays locked against anyone else.
    fd = os.open(path / ".lock", os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    mine.remove()
    mine.remove()  # idempotent
    alive.remove()
    assert [p.name for p in root.iterdir()] == ["p-young"]


def test_closing_a_backend_that_never_started_is_harmless(tmp_path):
    backend = KubernetesBackend(Settings(backend="kubernetes", state_dir=tmp_path))
    asyncio.run(backend.close(delete_sandboxes=False))

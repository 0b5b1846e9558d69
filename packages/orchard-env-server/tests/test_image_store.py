"""The image store with real images: ``docker save`` archives of the test images (and a
multi-layer one built here) imported and unpacked exactly as Docker shows them, OCI
layouts, names, removal, prune, and one unpack for concurrent callers."""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import os
import shutil
import tarfile
import threading
import time
from pathlib import Path

import pytest
from images.trees import assert_unpacked_as_docker_shows

from orchard_env_server.images import BadImage, ImageNotFound, ImageStore, InvalidReference
from orchard_testing import BUSYBOX_IMAGE, IMAGES, docker

BUSYBOX = "docker.io/orchard-test/busybox:latest"
DEBIAN_IMAGE = IMAGES["docker"]


def _same_as_docker(store: ImageStore, image_name: str, tmp_path: Path) -> Path:
    image = store.resolve(image_name)
    assert image is not None
    tree = store.rootfs(image)
    assert_unpacked_as_docker_shows(tree, image_name, tmp_path)
    return tree


def _inspect(image: str) -> dict:
    return json.loads(docker("image", "inspect", image))[0]


def test_a_docker_save_of_busybox_is_unpacked_as_docker_shows_it(saved_image, tmp_path):
    store = ImageStore(tmp_path / "store")
    (image,) = store.import_archive(saved_image(BUSYBOX_IMAGE))
    docker_view = _inspect(BUSYBOX_IMAGE)
    assert image.id == docker_view["Id"]
    assert image.names == (BUSYBOX,)
    assert image.manifest_digest is None
    assert image.config.cmd == tuple(docker_view["Config"]["Cmd"])
    assert image.config.env == tuple(docker_view["Config"]["Env"])
    assert image.created is not None and image.size_bytes > 1_000_000
    tree = _same_as_docker(store, BUSYBOX_IMAGE, tmp_path)
    assert tree == tmp_path / "store" / "rootfs" / image.id.split(":")[1]
    assert ":" not in str(tree.relative_to(tmp_path)) and "," not in str(tree)
    assert (tmp_path / "store").stat().st_mode & 0o777 == 0o700
    assert list((tmp_path / "store" / "tmp").iterdir()) == []


def test_whiteouts_and_opaque_directories_of_a_built_image(saved_image, layered_image, tmp_path):
    store = ImageStore(tmp_path / "store")
    store.import_archive(saved_image(layered_image))
    tree = _same_as_docker(store, layered_image, tmp_path)
    assert not (tree / "gone").exists() and not (tree / "gone-dir").exists()
    assert sorted(os.listdir(tree / "d")) == ["new"]  # the opaque directory
    assert sorted(os.listdir(tree / "w")) == ["y"] and (tree / "w").stat().st_mode & 0o777 == 0o555
    new = (tree / "d" / "new").stat()
    assert new.st_mode & 0o7777 == 0o4755 and (new.st_uid, new.st_gid) == (1234, 5678)
    assert (tree / "hl1").stat().st_ino == (tree / "hl3").stat().st_ino
    assert os.readlink(tree / "abs-link") == "/etc/passwd"


@pytest.mark.slow
def test_a_docker_save_of_debian_is_unpacked_as_docker_shows_it(saved_image, tmp_path):
    store = ImageStore(tmp_path / "store")
    started = time.monotonic()
    (image,) = store.import_archive(saved_image(DEBIAN_IMAGE))
    imported = time.monotonic() - started
    started = time.monotonic()
    store.rootfs(image)
    unpacked = time.monotonic() - started
    print(f"\ndebian: import {imported:.2f} s, unpack {unpacked:.2f} s")
    assert image.config.working_dir == _inspect(DEBIAN_IMAGE)["Config"]["WorkingDir"]
    _same_as_docker(store, DEBIAN_IMAGE, tmp_path)
    assert unpacked < 30


# -- OCI layouts


def oci_layout(
    save: Path, into: Path, annotations: dict[str, str] | None, nested: bool = False
) -> Path:
    """An OCI image layout (gzip layers) of the image of a ``docker save`` archive."""
    blobs = into / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    with tarfile.open(save) as tf:

        def read(name: str) -> bytes:
            fh = tf.extractfile(name)
            assert fh is not None
            return fh.read()

        (entry,) = json.loads(read("manifest.json"))
        config = put(read(entry["Config"]))
        layers = [put(gzip.compress(read(name), 1)) for name in entry["Layers"]]
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}
            for layer in layers
        ],
    }
    top = {"mediaType": manifest["mediaType"], **put(json.dumps(manifest).encode())}
    if nested:
        arm = {**top, "platform": {"os": "linux", "architecture": "arm64"}}
        amd = {**top, "platform": {"os": "linux", "architecture": "amd64"}}
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{**arm, "digest": "sha256:" + "0" * 64}, amd],
        }
        top = {"mediaType": index["mediaType"], **put(json.dumps(index).encode())}
    if annotations:
        top["annotations"] = annotations
    (into / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (into / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))
    return into


def _tar_of(directory: Path) -> Path:
    target = directory.with_suffix(".tar")
    with tarfile.open(target, "w") as tf:
        for path in sorted(directory.rglob("*")):
            tf.add(path, str(path.relative_to(directory)), recursive=False)
    return target


@pytest.mark.parametrize("form", ["directory", "tar"])
def test_an_oci_layout_imports_with_its_name(saved_image, tmp_path, form):
    layout = oci_layout(
        saved_image(BUSYBOX_IMAGE),
        tmp_path / "layout",
        {"org.opencontainers.image.ref.name": "127.0.0.1:5000/oci/busybox:v1"},
    )
    store = ImageStore(tmp_path / "store")
    path = layout if form == "directory" else _tar_of(layout)
    (image,) = store.import_archive(path)
    assert image.names == ("127.0.0.1:5000/oci/busybox:v1",)
    index = json.loads((layout / "index.json").read_text())
    assert image.manifest_digest == index["manifests"][0]["digest"]
    assert image.id == _inspect(BUSYBOX_IMAGE)["Id"]
    assert (store.rootfs(image) / "bin" / "busybox").is_file()  # gzip layers


def test_an_oci_layout_without_a_full_name_is_stored_by_id(saved_image, tmp_path):
    layout = oci_layout(
        saved_image(BUSYBOX_IMAGE),
        tmp_path / "layout",
        {"org.opencontainers.image.ref.name": "latest"},
        nested=True,
    )
    store = ImageStore(tmp_path / "store")
    (image,) = store.import_archive(layout)
    assert image.names == ()
    assert store.resolve(image.id) == image
    assert store.resolve(image.id.split(":")[1][:12]) == image
    assert store.list() == [image]
    tagged = store.tag(image.id[:19], "mine/busybox:1")
    assert tagged.names == ("docker.io/mine/busybox:1",)
    store.remove("mine/busybox:1")
    assert store.resolve(image.id) is not None  # it came without a name: it stays


def test_broken_archives_are_bad_images(saved_image, tmp_path):
    store = ImageStore(tmp_path / "store")
    layout = oci_layout(saved_image(BUSYBOX_IMAGE), tmp_path / "layout", None)
    for blob in (layout / "blobs" / "sha256").iterdir():
        if blob.stat().st_size > 100_000:  # the layer
            data = bytearray(blob.read_bytes())
            data[len(data) // 2] ^= 0xFF
            blob.write_bytes(bytes(data))
    with pytest.raises(BadImage, match="digest"):
        store.import_archive(layout)
    (tmp_path / "junk").write_bytes(b"not an archive")
    with pytest.raises(BadImage):
        store.import_archive(tmp_path / "junk")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadImage, match="neither"):
        store.import_archive(tmp_path / "empty")
    with (
        tarfile.open(saved_image(BUSYBOX_IMAGE)) as tf,
        tarfile.open(tmp_path / "x.tar", "w") as out,
    ):
        for member in tf:
            if not member.name.endswith("layer.tar"):
                out.addfile(member, tf.extractfile(member) if member.isfile() else None)
    with pytest.raises(BadImage, match=r"layer\.tar"):
        store.import_archive(tmp_path / "x.tar")
    with pytest.raises(FileNotFoundError):
        store.import_archive(tmp_path / "nothing-here.tar")


def test_a_layer_changed_in_the_store_is_refused_at_unpack(saved_image, tmp_path):
    store = ImageStore(tmp_path / "store")
    (image,) = store.import_archive(saved_image(BUSYBOX_IMAGE))
    for blob in (tmp_path / "store" / "blobs" / "sha256").iterdir():
        if blob.stat().st_size > 100_000:
            with open(blob, "r+b") as fh:
                fh.seek(-100, os.SEEK_END)  # the zero padding after the end: still a tar
                fh.write(b"tampered")
    with pytest.raises(BadImage, match="its content is"):
        store.rootfs(image)
    assert list((tmp_path / "store" / "tmp").iterdir()) == []
    assert not (tmp_path / "store" / "rootfs" / image.id.split(":")[1]).exists()


# -- names, removal, prune


def test_names_tags_and_removal(saved_image, tmp_path):
    store = ImageStore(tmp_path / "store")
    (image,) = store.import_archive(saved_image(BUSYBOX_IMAGE))
    short = image.id.split(":")[1][:12]
    for ref in (BUSYBOX_IMAGE, BUSYBOX, image.id, short, f"sha256:{short}"):
        assert store.resolve(ref) == image, ref
    assert store.resolve("orchard-test/busybox:other") is None
    assert store.resolve("abcdef123456") is None
    with pytest.raises(InvalidReference):
        store.resolve("Not/A/Reference")
    store.tag(BUSYBOX_IMAGE, "127.0.0.1:5000/copy")
    assert store.resolve(image.id).names == ("127.0.0.1:5000/copy:latest", BUSYBOX)
    with pytest.raises(ImageNotFound):
        store.tag("missing:1", "x")
    with pytest.raises(InvalidReference):
        store.tag(BUSYBOX_IMAGE, "x@sha256:" + "a" * 64)
    removed = store.remove(BUSYBOX_IMAGE)  # a name: untagged, the image stays
    assert removed.id == image.id
    assert store.resolve(image.id).names == ("127.0.0.1:5000/copy:latest",)
    store.remove("127.0.0.1:5000/copy")  # its last name: the image goes too
    assert store.list() == []
    with pytest.raises(ImageNotFound):
        store.remove(BUSYBOX_IMAGE)
    store.import_archive(saved_image(BUSYBOX_IMAGE))
    store.tag(BUSYBOX_IMAGE, "second")
    assert store.remove(short).names == ("docker.io/library/second:latest", BUSYBOX)
    assert store.list() == []  # by id: every name with it


def test_prune_frees_what_no_image_needs_and_nothing_else(saved_image, layered_image, tmp_path):
    store = ImageStore(tmp_path / "store")
    (busybox,) = store.import_archive(saved_image(BUSYBOX_IMAGE))
    (layered,) = store.import_archive(saved_image(layered_image))
    kept, gone = store.rootfs(busybox), store.rootfs(layered)
    (tmp_path / "store" / "tmp" / "abc.partial").write_bytes(b"x" * 1000)
    assert store.prune() == (1, 1000)  # the partial download only
    store.remove(layered_image)
    files, freed = store.prune()
    assert not gone.exists() and kept.is_dir()
    assert files > 5 and freed > 1000
    assert store.rootfs(store.resolve(BUSYBOX_IMAGE)) == kept
    store.remove(BUSYBOX_IMAGE)
    # A backend holding an flock on a tree it still runs sandboxes on keeps it.
    fd = os.open(kept, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        store.prune()
        assert kept.is_dir()
    finally:
        os.close(fd)
    store.prune()
    assert not kept.exists()
    assert list((tmp_path / "store" / "blobs" / "sha256").iterdir()) == []


def test_concurrent_callers_wait_for_one_unpack(saved_image, tmp_path, monkeypatch):
    store = ImageStore(tmp_path / "store")
    (image,) = store.import_archive(saved_image(BUSYBOX_IMAGE))
    calls = []
    unpack = ImageStore._unpack

    def counted(self, *args):
        calls.append(1)
        time.sleep(0.3)
        return unpack(self, *args)

    monkeypatch.setattr(ImageStore, "_unpack", counted)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(ImageStore(store.root).rootfs(image)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1 and len(results) == 4
    shutil.rmtree(results[0])  # gone (a prune by hand, say): unpacked again on demand
    assert store.rootfs(image) == results[0] and len(calls) == 2

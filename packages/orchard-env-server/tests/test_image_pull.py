"""Pulls from a real registry (Debian's docker-registry on 127.0.0.1, images pushed with
``docker push``): plain http, bearer tokens, mirrors, manifest lists, resumed downloads,
and content that does not match its digest."""

from __future__ import annotations

import json
import platform
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from images.registry import LocalRegistry, RegistryProxy, index_document
from images.trees import assert_unpacked_as_docker_shows

from orchard_env_server.images import BadImage, ImageNotFound, ImageStore, RegistryError
from orchard_testing import BUSYBOX_IMAGE, IMAGES, docker

DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def _image_id(image: str) -> str:
    return json.loads(docker("image", "inspect", image))[0]["Id"]


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "store")


@pytest.fixture
def busybox(pushed) -> str:
    """The repo:tag busybox is pushed as; its manifest digest is ``pushed``'s answer."""
    pushed(BUSYBOX_IMAGE, "orchard-test/busybox:latest")
    return "orchard-test/busybox:latest"


@pytest.fixture
def proxy(local_registry: LocalRegistry) -> Iterator[RegistryProxy]:
    front = RegistryProxy(local_registry.url)
    yield front
    front.stop()


def test_a_pull_over_plain_http_unpacks_as_docker_shows_it(
    store, local_registry, pushed, busybox, tmp_path
):
    digest = pushed(BUSYBOX_IMAGE, busybox)
    seen: list[tuple[str, int, int | None]] = []
    image = store.pull(
        f"{local_registry.host}/{busybox}", insecure=True, progress=lambda *a: seen.append(a)
    )
    assert image.names == (f"{local_registry.host}/{busybox}",)
    assert image.manifest_digest == digest
    assert image.id == _image_id(BUSYBOX_IMAGE)
    manifest, _ = local_registry.manifest("orchard-test/busybox", "latest")
    assert image.size_bytes == sum(layer["size"] for layer in manifest["layers"])
    last = seen[-1]
    assert last[0].startswith("layer ") and last[1] == last[2] == manifest["layers"][0]["size"]
    assert_unpacked_as_docker_shows(store.rootfs(image), BUSYBOX_IMAGE, tmp_path)
    # Pulled again: nothing downloaded, the same image.
    assert store.pull(f"{local_registry.host}/{busybox}", insecure=True) == image
    assert store.resolve(f"{local_registry.host}/{busybox}") == image
    assert list((store.root / "tmp").iterdir()) == []


def test_plain_http_needs_insecure(store, local_registry, busybox):
    with pytest.raises(RegistryError, match="--insecure") as info:
        store.pull(f"{local_registry.host}/{busybox}", allow_private=True)
    assert info.value.code == "registry_error"
    # Neither insecure nor a mirror: a loopback registry is not reached at all.
    with pytest.raises(RegistryError, match="non-public address, and the operator did not"):
        store.pull(f"{local_registry.host}/{busybox}")


def test_unknown_images_are_not_found(store, local_registry, busybox):
    for ref in (
        f"{local_registry.host}/orchard-test/busybox:nope",
        f"{local_registry.host}/no/such-repo",
    ):
        with pytest.raises(ImageNotFound, match=r"MANIFEST_UNKNOWN|NAME_UNKNOWN"):
            store.pull(ref, insecure=True)
    with pytest.raises(RegistryError, match="cannot reach"):
        store.pull("127.0.0.1:9/x", insecure=True)


def test_an_anonymous_bearer_token_is_fetched_and_sent(store, proxy, busybox):
    image = store.pull(f"{proxy.host}/{busybox}", insecure=True)
    assert image.names == (f"{proxy.host}/{busybox}",)
    assert len(proxy.tokens) == 1
    assert proxy.token_queries[0] == {
        "scope": ["repository:orchard-test/busybox:pull"],
        "service": ["orchard-test"],
    }
    repo_requests = [h for p, h in proxy.requests if p.startswith("/v2/orchard-test/")]
    assert len(repo_requests) == 3  # manifest, config, layer: each with the token
    assert all(h.get("authorization") == f"Bearer {proxy.tokens[0]}" for h in repo_requests)


def test_a_mirror_serves_docker_hub_names(store, local_registry, pushed):
    pushed(BUSYBOX_IMAGE, "library/busybox:latest")
    image = store.pull("busybox", mirrors={"docker.io": local_registry.url})
    assert image.names == ("docker.io/library/busybox:latest",)
    assert store.resolve("busybox") == image


@pytest.mark.parametrize("media_type", [DOCKER_LIST, OCI_INDEX])
def test_a_manifest_list_gives_this_machines_image(
    store, local_registry, pushed, layered_image, media_type
):
    images = {"layered": layered_image, "busybox": BUSYBOX_IMAGE}
    digests = {tag: pushed(image, f"multi:{tag}") for tag, image in images.items()}
    native = "arm64" if platform.machine() in ("aarch64", "arm64") else "amd64"
    other = "amd64" if native == "arm64" else "arm64"

    def entry(tag: str, platform: str) -> tuple[str, int, str, str]:
        size = len(_raw_manifest(local_registry, "multi", digests[tag]))
        return DOCKER_MANIFEST, size, digests[tag], platform

    entries = [
        entry("layered", f"linux/{other}"),
        entry("busybox", f"linux/{native}"),
        entry("busybox", "unknown/unknown"),
    ]
    tag = "docker-list" if media_type == DOCKER_LIST else "oci-index"
    list_digest = local_registry.put_manifest("multi", tag, index_document(media_type, entries))
    image = store.pull(f"{local_registry.host}/multi:{tag}", insecure=True)
    assert image.id == _image_id(BUSYBOX_IMAGE)
    assert image.manifest_digest == list_digest
    assert store.resolve(_image_id(layered_image)) is None  # the other one is not fetched
    # No entry for this machine: not found, and the error says what there is.
    only_other = index_document(media_type, entries[:1])
    local_registry.put_manifest("multi", f"{tag}-other", only_other)
    with pytest.raises(ImageNotFound, match=f"no linux/{native}.*linux/{other}"):
        store.pull(f"{local_registry.host}/multi:{tag}-other", insecure=True)


def _raw_manifest(registry: LocalRegistry, repo: str, digest: str) -> bytes:
    response = httpx.get(
        f"{registry.url}/v2/{repo}/manifests/{digest}", headers={"Accept": DOCKER_MANIFEST}
    )
    response.raise_for_status()
    return response.content


def test_a_dropped_download_continues_where_it_stopped(store, proxy, busybox):
    proxy.cut_blobs_after, proxy.cut_times = 200_000, 1
    image = store.pull(f"{proxy.host}/{busybox}", insecure=True)
    ranges = [h.get("range") for h in proxy.blob_requests()]
    assert "bytes=200000-" in ranges, ranges
    assert (store.rootfs(image) / "bin" / "busybox").is_file()


def test_a_failed_pull_is_continued_by_the_next(store, proxy, busybox):
    proxy.cut_blobs_after, proxy.cut_times = 100_000, 100
    with pytest.raises(RegistryError, match="kept for the next pull"):
        store.pull(f"{proxy.host}/{busybox}", insecure=True)
    (partial,) = (store.root / "tmp").glob("*.partial")
    assert partial.stat().st_size == 400_000  # four attempts, 100 kB each
    proxy.cut_times = 0
    proxy.requests.clear()
    image = store.pull(f"{proxy.host}/{busybox}", insecure=True)
    assert [h.get("range") for h in proxy.blob_requests()] == ["bytes=400000-"]
    assert not partial.exists()
    assert (store.rootfs(image) / "bin" / "busybox").is_file()


def test_content_that_is_not_its_digest_is_refused(store, proxy, pushed, busybox):
    proxy.corrupt_blobs = True
    with pytest.raises(BadImage, match="different content") as info:
        store.pull(f"{proxy.host}/{busybox}", insecure=True)
    assert info.value.code == "bad_image"
    assert list((store.root / "tmp").iterdir()) == []
    assert store.list() == []
    proxy.corrupt_blobs = False
    proxy.rewrite_manifests = True
    digest = pushed(BUSYBOX_IMAGE, busybox)
    with pytest.raises(BadImage, match="digest"):
        store.pull(f"{proxy.host}/orchard-test/busybox@{digest}", insecure=True)
    with pytest.raises(BadImage, match="header says"):
        store.pull(f"{proxy.host}/{busybox}", insecure=True)
    proxy.rewrite_manifests = False
    image = store.pull(f"{proxy.host}/orchard-test/busybox@{digest}", insecure=True)
    assert image.names == (f"{proxy.host}/orchard-test/busybox@{digest}",)
    assert image.manifest_digest == digest


def test_concurrent_pulls_of_one_image_share_the_downloads(store, local_registry, busybox):
    results: list[object] = []

    def pull() -> None:
        try:
            results.append(store.pull(f"{local_registry.host}/{busybox}", insecure=True))
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=pull) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and all(r == results[0] for r in results), results


@pytest.mark.slow
def test_a_debian_pull_from_the_local_registry(store, local_registry, pushed, tmp_path):
    debian = IMAGES["docker"]
    pushed(debian, "orchard-test/debian:latest")
    started = time.monotonic()
    image = store.pull(f"{local_registry.host}/orchard-test/debian", insecure=True)
    pulled = time.monotonic() - started
    started = time.monotonic()
    tree = store.rootfs(image)
    unpacked = time.monotonic() - started
    print(
        f"\ndebian from the local registry: pull {pulled:.2f} s "
        f"({image.size_bytes / 1e6:.0f} MB gzip), unpack {unpacked:.2f} s"
    )
    assert image.id == _image_id(debian)
    assert_unpacked_as_docker_shows(tree, debian, tmp_path)
